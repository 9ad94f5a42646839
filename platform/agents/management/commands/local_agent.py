"""Prepare a host for a local agent and print its (new) token: used by `make run`.

    manage.py local_agent NAME [--simulated] [--tiny-model DIR]

Creates or updates host NAME (address 127.0.0.1) and rotates its agent token (earlier tokens are
revoked), printing the new one alone on stdout. With ``--tiny-model DIR`` it also makes sure the
served model ``tiny-llama`` (source DIR, vLLM's CPU build) is deployed on the host's device 0. The
device row is created ahead of the agent's first `register` (which then updates it with what the
agent reports), so the deployment exists when the agent first asks for its desired list.
"""

from __future__ import annotations

import os
from typing import Any

from deployments.models import Deployment, DesiredState
from deployments.services import create_deployment
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from inventory.models import Device, DeviceKind, Host
from inventory.services import issue_agent_token, register_host
from inventory.validators import host_name_error
from registry.models import ServedModel

TINY_MODEL = "tiny-llama"
# vLLM CPU engine options for the tiny model: 1 GiB KV cache, a fixed seed, no torch.compile warm-up
# (minutes on a busy 2-core machine, for a model this small).
TINY_OPTIONS = {"cpu_kvcache_space_gib": 1, "seed": 0, "enforce_eager": True}


class Command(BaseCommand):
    help = "Create/update a local agent's host, rotate and print its token; optionally deploy the tiny model."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name")
        parser.add_argument("--simulated", action="store_true", help="a simulated host (--simulate agents)")
        parser.add_argument("--tiny-model", help="directory of the built tiny model to deploy on device 0")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        if error := host_name_error(name):
            raise CommandError(error)
        tiny = options["tiny_model"]
        if tiny is not None and not os.path.isdir(tiny):
            raise CommandError(f"--tiny-model {tiny!r} is not a directory")
        with transaction.atomic():
            host = register_host(name, "127.0.0.1", simulated=options["simulated"])
            if tiny is not None:
                deploy_tiny_model(host, os.path.abspath(tiny))
            token = issue_agent_token(host).plaintext
        self.stdout.write(token)


def deploy_tiny_model(host: Host, source: str) -> Deployment:
    """The running deployment of the tiny model on the host's device 0 (created if missing)."""
    model, _ = ServedModel.objects.update_or_create(
        name=TINY_MODEL,
        defaults={
            "source": source,
            "dtype": "float32",
            "tensor_parallel_size": 1,
            "max_context_length": 256,
            "slo_ttft_p99_ms": 2000.0,
            "slo_tbt_p99_ms": 500.0,
            "engine_options": TINY_OPTIONS,
        },
    )
    device, _ = Device.objects.get_or_create(
        host=host,
        index=0,
        defaults={
            "uuid": f"cpu-{host.name}",
            "name": "CPU",
            "kind": DeviceKind.CPU,
            "memory_total_bytes": 0,  # the agent's register fills in the real figure
        },
    )
    existing = Deployment.objects.filter(model=model, host=host, desired_state=DesiredState.RUNNING).first()
    return existing or create_deployment(model, host, [device])
