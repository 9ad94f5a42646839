"""An agent that cannot find its outward IP announces its engines on 127.0.0.1, which a gateway on
another machine takes for its own loopback: it says so at start, naming --address."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

import gpu_agent.cli as cli
import gpu_agent.config as config


@pytest.fixture
def no_route(monkeypatch: pytest.MonkeyPatch) -> None:
    def unroutable(*args: object) -> socket.socket:
        raise OSError(101, "Network is unreachable")  # connect() with no route out

    monkeypatch.setattr(config.socket, "socket", unroutable)
    monkeypatch.setattr(cli, "make_host", lambda cfg: object())  # nothing runs: only the start
    monkeypatch.setattr(cli, "_run_agent", lambda cfg, host: None)


def warnings_of(caplog: pytest.LogCaptureFixture, *argv: str) -> list[str]:
    with caplog.at_level(logging.WARNING, logger="gpu_agent"):
        assert cli.main(["--token", "t", *argv]) == 0
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.usefixtures("no_route")
def test_it_warns_of_the_loopback_fallback_when_the_control_plane_is_elsewhere(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert cli.make_config(["--control-plane", "http://cp:8000", "--token", "t"]).address == "127.0.0.1"
    (warning,) = warnings_of(caplog, "--control-plane", "https://cp.example:8000")
    assert "outward IP" in warning and "--address 127.0.0.1" in warning and "Set --address" in warning


@pytest.mark.usefixtures("no_route")
@pytest.mark.parametrize(
    "argv",
    [
        ["--control-plane", "http://127.0.0.1:8000"],  # the control plane is on this machine
        ["--control-plane", "http://localhost:8000"],
        ["--control-plane", "http://[::1]:8000"],
        ["--control-plane", "https://cp:8000", "--address", "10.0.0.5"],  # given
        ["--control-plane", "https://cp:8000", "--address", "127.0.0.1"],  # given (a tunnel, say)
        ["--control-plane", "https://cp:8000", "--simulate", "1xH100"],  # no engine is reached
    ],
)
def test_it_does_not_warn_when_loopback_is_right_or_chosen(
    caplog: pytest.LogCaptureFixture, argv: list[str]
) -> None:
    assert warnings_of(caplog, *argv) == []


@pytest.mark.usefixtures("no_route")
def test_an_address_from_the_config_file_counts_as_given(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("control_plane: https://cp:8000\naddress: gpu-1.example\n")
    assert warnings_of(caplog, "--config", str(path)) == []
