"""The control-plane image's HEALTHCHECK: ``python -m core.healthcheck [PORT]`` (default 8000).

GETs ``/api/health/`` from the web server in this container with a Host header that ALLOWED_HOSTS
admits. Sent to 127.0.0.1 as it was, the check failed (400) as soon as an operator listed only
the name the dashboard is served at, and with it everything that waits for a healthy web (worker,
beat, agent). Exits 0 on a 200, else 1 with one line saying why (Docker's convention). Imports no
Django: it runs every few seconds.
"""

from __future__ import annotations

import http.client
import os
import sys
from collections.abc import Sequence

HEALTH_PATH = "/api/health/"
DEFAULT_PORT = 8000


def probe_host(allowed_hosts: str | None) -> str:
    """A Host header that ``ALLOWED_HOSTS`` (the raw variable, as settings reads it) admits.

    Its first entry, a leading-dot subdomain pattern as its own domain (".example.com" ->
    "example.com"); 127.0.0.1 when it is unset or blank (the settings' default list has it) or
    allows any host ("*").
    """
    entries = [entry.strip() for entry in (allowed_hosts or "").split(",") if entry.strip()]
    if not entries or "*" in entries:
        return "127.0.0.1"
    return entries[0].removeprefix(".")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        port = int(args[0]) if args else DEFAULT_PORT
    except ValueError:
        print(f"unhealthy: port {args[0]!r} is not a number")
        return 1
    host = probe_host(os.environ.get("ALLOWED_HOSTS"))
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", HEALTH_PATH, headers={"Host": host})
        status = connection.getresponse().status
    except OSError as exc:
        print(f"unhealthy: GET http://127.0.0.1:{port}{HEALTH_PATH}: {exc}")
        return 1
    finally:
        connection.close()
    if status != 200:
        print(f"unhealthy: GET http://127.0.0.1:{port}{HEALTH_PATH} (Host: {host}) answered {status}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
