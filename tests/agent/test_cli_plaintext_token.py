"""The agent sends its host token with every connection to the control plane: over http:// or ws://
to another machine it travels unencrypted, so the agent says so at start, naming the URL and
https/wss (it still connects: a docker-compose network serves plain http)."""

from __future__ import annotations

import logging

import pytest

import gpu_agent.cli as cli


@pytest.fixture(autouse=True)
def not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "make_host", lambda cfg: object())  # nothing runs: only the start
    monkeypatch.setattr(cli, "_run_agent", lambda cfg, host: None)


def warnings_of(caplog: pytest.LogCaptureFixture, url: str) -> list[str]:
    with caplog.at_level(logging.WARNING, logger="gpu_agent"):
        assert cli.main(["--token", "t", "--control-plane", url, "--address", "10.0.0.5"]) == 0
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    "url", ["http://cp.example:8000", "ws://10.0.0.2:8000/prefix", "http://web:8000", "http://[2001:db8::1]"]
)
def test_it_warns_once_that_the_token_travels_unencrypted(caplog: pytest.LogCaptureFixture, url: str) -> None:
    (warning,) = warnings_of(caplog, url)
    assert url in warning and "unencrypted" in warning and "https://" in warning and "wss://" in warning


@pytest.mark.parametrize(
    "url",
    [
        "https://cp.example:8000",
        "wss://cp.example:8000",
        "http://127.0.0.1:8000",  # loopback: the token never leaves the machine
        "http://127.1.2.3:8000",
        "ws://localhost:8000",
        "http://[::1]:8000",
    ],
)
def test_it_does_not_warn_over_tls_or_loopback(caplog: pytest.LogCaptureFixture, url: str) -> None:
    assert warnings_of(caplog, url) == []
