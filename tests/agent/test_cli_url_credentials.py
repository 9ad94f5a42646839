"""A --control-plane URL may carry user information (``https://user:password@proxy:8443``, for a
proxy in front of the control plane). The agent connects with it as given, but no log line or error
message shows the credential: the URL is shown as ``https://***@proxy:8443``. Every line showed it
in full: "connecting to", each "link ... down" warning, the plain-http and fallback-address
warnings at start, and the CLI's errors about a bad URL."""

from __future__ import annotations

import asyncio
import base64
import logging
import socket

import pytest

import gpu_agent.cli as cli
import gpu_agent.config as config
from gpu_agent.agent import Agent
from gpu_agent.link import AgentLink, redacted_url
from gpu_agent.protocol import Frame
from serving.backoff import Backoff
from tests.agent.ws_server import ControlPlaneStub, wait_for

SECRET = "s3cret-pw"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """What the agent logged (not the stand-in control plane: websockets.server)."""
    mine = [r for r in caplog.records if not r.name.startswith("websockets.server")]
    return "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in mine)


@pytest.mark.parametrize("userinfo", [f"admin:{SECRET}", SECRET])  # (a user alone: websockets' InvalidURI)
def test_the_running_agent_never_logs_the_urls_credentials(
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    userinfo: str,
) -> None:
    url = f"http://{userinfo}@127.0.0.1:{closed_port()}/cp"
    links: list[str] = []

    async def serve_one_retry(agent: Agent) -> None:  # the real link, until it logged a retry
        links.append(agent.link.url)
        task = asyncio.create_task(agent.link.run())
        while agent.link.stats.failed_attempts == 0:
            await asyncio.sleep(0.01)
        agent.link.stop()
        await task

    monkeypatch.setattr(cli, "_serve", serve_one_retry)
    argv = ["--token", "t", "--control-plane", url, "--simulate", "1xH100", "--address", "10.0.0.5"]
    with caplog.at_level(logging.DEBUG):
        assert cli.main([*argv, "--log-level", "DEBUG"]) == 0
    text = logged(caplog) + capsys.readouterr().err
    assert links == [f"ws://{userinfo}@127.0.0.1:{url.rsplit(':', 1)[1]}/ws/agent/"]  # connects as given
    assert "connecting to ws://***@127.0.0.1:" in text and "down (" in text
    assert SECRET not in text


def test_the_start_warnings_do_not_show_the_urls_credentials(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "outward_ip", lambda: None)  # the loopback --address fallback
    monkeypatch.setattr(cli, "make_host", lambda cfg: object())  # nothing runs: only the start
    monkeypatch.setattr(cli, "_run_agent", lambda cfg, host: None)
    with caplog.at_level(logging.WARNING, logger="gpu_agent"):
        assert cli.main(["--token", "t", "--control-plane", f"http://admin:{SECRET}@cp.example:8000"]) == 0
    plaintext, fallback = (r.getMessage() for r in caplog.records)
    assert "http://***@cp.example:8000 is plain http://" in plaintext and "--address 127.0.0.1" in fallback
    assert SECRET not in logged(caplog)


@pytest.mark.parametrize(
    ("url", "error"),
    [
        (f"ftp://admin:{SECRET}@cp:8000", "'ftp://***@cp:8000' must start with http(s):// or ws(s)://"),
        (f"admin:{SECRET}@cp:8000", "'***@cp:8000' must start with"),
        (f"http://admin:{SECRET}@cp:0", "'http://***@cp:0': port 0 is no port"),
        (f"http://admin:{SECRET}@cp:99999", "'http://***@cp:99999': Port out of range"),
        (f"http://admin:{SECRET}@:8000", "'http://***@:8000' has no host name"),
        (f"http://admin:{SECRET}@cp:8000/a b", "'http://***@cp:8000/a b' contains whitespace"),
        (f"http://admin:{SECRET}@cp:8000/\x1b", "--control-plane='http://***@cp:8000/\\x1b' holds a control"),
        (f"http://admin:{SECRET}@cp/\udcff", "--control-plane='http://***@cp/\\udcff' holds undecodable"),
    ],
)
def test_errors_about_a_bad_url_do_not_show_its_credentials(
    capsys: pytest.CaptureFixture[str], url: str, error: str
) -> None:
    assert cli.main(["--token", "t", "--control-plane", url]) == 2
    err = capsys.readouterr().err
    assert error in err and SECRET not in err


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://u:p@cp:8443/prefix", "https://***@cp:8443/prefix"),
        ("wss://token@cp", "wss://***@cp"),
        ("http://u:p/w@rd@cp:8000", "http://***@cp:8000"),  # an unescaped '/' and '@' in the password
        ("http://[::1]:8000/x", "http://[::1]:8000/x"),  # nothing to hide
        ("http://cp:8000", "http://cp:8000"),
    ],
)
def test_redacted_url(url: str, shown: str) -> None:
    assert redacted_url(url) == shown


@pytest.mark.asyncio
@pytest.mark.parametrize("userinfo", ["", f"admin:{SECRET}@"])
async def test_the_handshakes_debug_log_hides_the_token_and_the_urls_credentials(
    caplog: pytest.LogCaptureFixture, userinfo: str
) -> None:
    # websockets logs every handshake header at DEBUG: the host token ("Authorization: Bearer ..."),
    # and the URL's user information as Basic credentials (base64).
    token = f"host-token-{SECRET}"
    server = ControlPlaneStub(token=token)
    await server.start()

    async def ignore(frame: Frame) -> None:
        pass

    url = server.url.replace("http://", f"http://{userinfo}")
    link = AgentLink(url, token, hello=list, on_frame=ignore, backoff=Backoff(0.05, 0.2, seed=1))
    try:
        with caplog.at_level(logging.DEBUG):
            task = asyncio.create_task(link.run())
            await wait_for(lambda: link.stats.connects or link.stats.failed_attempts)
            link.stop()
            await task
    finally:
        await server.stop()
    text = logged(caplog)
    assert "> Authorization: [hidden]" in text  # the handshake was logged
    assert SECRET not in text and base64.b64encode(f"admin:{SECRET}".encode()).decode() not in text
