"""`.ci/run` on a machine without RabbitMQ: its production pass must not name one.

The RabbitMQ tests skip only when RABBITMQ_URL is unset or empty; named while nothing listens on
5672, each fails on a refused connection. Runs a copy of the script with stand-ins for make, the
services' clients and pytest (which reports the environment it was given) on a PATH without
rabbitmq-server, in a network namespace of its own (unshare -rn) where nothing listens on 5672.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _own_network_namespace() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    return subprocess.run([unshare, "-rn", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _own_network_namespace(), reason="needs unshare -rn (a network namespace)")
def test_without_rabbitmq_the_production_pass_names_none(tmp_path: Path) -> None:
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("make", "pg_isready", "redis-cli"):
        _stub(bin_dir / name, "exit 0")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    seen = tmp_path / "pytest-env"
    _stub(tmp_path / ".venv" / "bin" / "pytest", f'echo "RABBITMQ_URL=${{RABBITMQ_URL:-}}" > "{seen}"')
    dirname = shutil.which("dirname")
    assert dirname is not None
    (bin_dir / "dirname").symlink_to(dirname)
    # Nothing else on PATH: no rabbitmq-server, as on a machine without RabbitMQ.
    env = {k: v for k, v in os.environ.items() if k != "RABBITMQ_URL"}
    env["PATH"] = str(bin_dir)
    argv = [str(shutil.which("unshare")), "-rn", str(shutil.which("bash")), str(tmp_path / ".ci" / "run")]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert seen.read_text().strip() == "RABBITMQ_URL="
