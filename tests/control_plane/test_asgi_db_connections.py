"""The web server (ASGI) keeps no persistent database connections; the Celery processes may.

Under ASGI Django runs each request's synchronous part in a thread of its own, so with
CONN_MAX_AGE > 0 every concurrent request left a connection open until its age ran out (200 at
once left 62 of PostgreSQL's 100 open for 60 s). Each case runs in a fresh interpreter, as the
server and the worker start: settings are read once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PRINT_CONN_MAX_AGE = """
import sys
sys.path[:0] = [{root!r}, {platform!r}]
if sys.argv[1] == "asgi":
    import config.asgi
else:
    import django
    django.setup()
from django.conf import settings
print(settings.DATABASES["default"]["CONN_MAX_AGE"])
"""


def conn_max_age(entry: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_VERSION"}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DATABASE_URL="postgres://user:pw@db.invalid:5432/platform",  # parsed only, never reached
        DB_CONN_MAX_AGE="60",
        SECRET_KEY="asgi-db-connections-test-" + "x" * 40,
    )
    env.pop("REDIS_URL", None)
    code = PRINT_CONN_MAX_AGE.format(root=str(ROOT), platform=str(ROOT / "platform"))
    run = subprocess.run(
        [sys.executable, "-c", code, entry], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return int(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("entry", "expected"), [("asgi", 0), ("celery", 60)])
def test_it_keeps_persistent_connections_out_of_the_asgi_server_only(entry: str, expected: int) -> None:
    assert conn_max_age(entry) == expected
