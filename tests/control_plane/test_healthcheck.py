"""The control-plane image's health check passes whatever ALLOWED_HOSTS lists (core/healthcheck.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.http.request import split_domain_port, validate_host

from core.healthcheck import main, probe_host

DOCKERFILE = Path(__file__).resolve().parents[2] / "docker" / "control-plane.Dockerfile"


class _Server(ThreadingHTTPServer):
    allowed: list[str]
    status: int


class _Handler(BaseHTTPRequestHandler):
    """Django's host validation (as SecurityMiddleware's get_host applies it), then a fixed status."""

    server: _Server

    def do_GET(self) -> None:
        domain, _port = split_domain_port(self.headers.get("Host", ""))
        ok = bool(domain) and validate_host(domain, self.server.allowed)
        self.send_response(self.server.status if ok and self.path == "/api/health/" else 400)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.status = 200
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def settings_allowed_hosts(raw: str | None) -> list[str]:
    """ALLOWED_HOSTS as config/settings.py builds it from the variable (env_list)."""
    entries = [e.strip() for e in (raw or "").split(",") if e.strip()]
    return entries or ["127.0.0.1", "localhost", "[::1]"]


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "",
        "platform.example.com",
        "platform.example.com,10.0.0.5",
        ".example.com",
        "*",
        " web , localhost",
        "[::1],127.0.0.1",
    ],
)
def test_it_passes_against_a_server_that_admits_only_allowed_hosts(
    raw: str | None, server: _Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.allowed = settings_allowed_hosts(raw)
    if raw is None:
        monkeypatch.delenv("ALLOWED_HOSTS", raising=False)
    else:
        monkeypatch.setenv("ALLOWED_HOSTS", raw)
    assert main([str(server.server_address[1])]) == 0


def test_it_fails_when_the_server_is_unhealthy_or_gone(
    server: _Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ALLOWED_HOSTS", "platform.example.com")
    server.allowed = ["platform.example.com"]
    server.status = 503
    port = server.server_address[1]
    assert main([str(port)]) == 1
    assert "(Host: platform.example.com) answered 503" in capsys.readouterr().out
    server.shutdown()
    server.server_close()
    assert main([str(port)]) == 1
    assert "unhealthy: GET" in capsys.readouterr().out
    assert main(["eighty"]) == 1
    assert "port 'eighty' is not a number" in capsys.readouterr().out


def test_it_is_the_image_health_check() -> None:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("HEALTHCHECK"))
    command = json.loads(line.split(" CMD ", 1)[1])
    assert command == ["python", "-m", "core.healthcheck", "8000"]


def test_it_sends_the_first_allowed_name() -> None:
    assert probe_host("platform.example.com,10.0.0.5") == "platform.example.com"
    assert probe_host(".example.com") == "example.com"
    assert probe_host("*") == probe_host(None) == "127.0.0.1"
