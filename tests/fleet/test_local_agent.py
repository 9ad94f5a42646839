"""`manage.py local_agent`: the host, token and tiny-model deployment `make run` starts an agent with."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from deployments.models import Deployment
from django.core.management import CommandError, call_command
from inventory.models import Host
from inventory.services import authenticate_agent

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("local_agent", *args, stdout=out)
    return out.getvalue().strip()


def test_it_rotates_the_token_and_deploys_the_tiny_model_once(tmp_path: Path) -> None:
    first = run("local", "--tiny-model", str(tmp_path))
    second = run("local", "--tiny-model", str(tmp_path))
    host = Host.objects.get(name="local")
    assert authenticate_agent(second) == host
    assert authenticate_agent(first) is None  # rotated
    deployment = Deployment.objects.get(host=host)
    assert deployment.model.name == "tiny-llama" and deployment.model.source == str(tmp_path)
    assert [d.index for d in deployment.devices.all()] == [0]


def test_it_prepares_a_simulated_host_without_deployments() -> None:
    token = run("sim-8xh100", "--simulated")
    host = Host.objects.get(name="sim-8xh100")
    assert host.simulated and authenticate_agent(token) == host
    assert not Deployment.objects.exists()


def test_it_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="slug"):
        run("not a slug")
    with pytest.raises(CommandError, match="not a directory"):
        run("local", "--tiny-model", str(tmp_path / "missing"))
    assert not Host.objects.exists()
