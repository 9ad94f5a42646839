"""A --control-plane URL with user information (``https://user:password@proxy:8443``) is refused at
start, naming the flag: websockets sent it as an ``Authorization: Basic`` header beside the host
token's Bearer, two credentials in one header that the control plane (which reads the Bearer) and
every proxy on the way received, password included. The host token is the only credential.

No error message shows the credential either (the URL is shown as ``https://***@proxy:8443``), nor
does the handshake's DEBUG log show the token."""

from __future__ import annotations

import asyncio
import base64
import logging
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

import gpu_agent.cli as cli
from gpu_agent.link import AgentLink, redacted_url
from gpu_agent.protocol import Frame
from serving.backoff import Backoff
from tests.agent.ws_server import ControlPlaneStub, wait_for

SECRET = "s3cret-pw"


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """What the agent logged (not the stand-in control plane: websockets.server)."""
    mine = [r for r in caplog.records if not r.name.startswith("websockets.server")]
    return "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in mine)


@pytest.mark.parametrize(
    "url",
    [
        f"https://admin:{SECRET}@cp.example:8443/cp",
        f"wss://{SECRET}@cp.example",
        f"http://admin:{SECRET}@127.0.0.1:8000",
    ],
)
def test_a_url_with_user_information_is_refused_at_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str
) -> None:
    # websockets made it an "Authorization: Basic" header sent beside the token's Bearer.
    monkeypatch.setattr(cli, "make_host", lambda cfg: object())  # past the config, nothing runs
    monkeypatch.setattr(cli, "_run_agent", lambda cfg, host: None)
    assert cli.main(["--token", "t", "--control-plane", url]) == 2
    err = capsys.readouterr().err
    assert f"control plane URL '{redacted_url(url)}' carries user information" in err
    assert "remove it from --control-plane" in err and SECRET not in err
    path = tmp_path / "agent.yaml"
    path.write_text(f"control_plane: '{url}'\ntoken: t\n")
    assert cli.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"config file {str(path)!r}: control plane URL" in err and SECRET not in err


@pytest.mark.asyncio
async def test_the_handshake_carries_the_host_token_as_its_only_authorization() -> None:
    server = ControlPlaneStub(token="tok")
    await server.start()

    async def ignore(frame: Frame) -> None:
        pass

    try:
        # What the link refuses: websockets sends a URL's user information as a second header.
        userinfo = server.url.replace("http://", f"ws://admin:{SECRET}@") + "/ws/agent/"
        async with connect(userinfo, additional_headers={"Authorization": "Bearer tok"}):
            pass
        basic = "Basic " + base64.b64encode(f"admin:{SECRET}".encode()).decode()
        assert server.authorizations == [[basic, "Bearer tok"]]
        with pytest.raises(
            ValueError, match=r"'ws://\*\*\*@127\.0\.0\.1:\d+/ws/agent/' carries user information"
        ):
            AgentLink(userinfo, "tok", hello=list, on_frame=ignore)
        link = AgentLink(server.url, "tok", hello=list, on_frame=ignore, backoff=Backoff(0.05, 0.2, seed=1))
        task = asyncio.create_task(link.run())
        await wait_for(lambda: link.stats.connects or link.stats.failed_attempts)
        link.stop()
        await task
    finally:
        await server.stop()
    assert link.stats.connects == 1 and server.authorizations[1:] == [["Bearer tok"]]


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
async def test_the_handshakes_debug_log_hides_the_token(caplog: pytest.LogCaptureFixture) -> None:
    # websockets logs every handshake header at DEBUG: the host token ("Authorization: Bearer ...").
    token = f"host-token-{SECRET}"
    server = ControlPlaneStub(token=token)
    await server.start()

    async def ignore(frame: Frame) -> None:
        pass

    link = AgentLink(server.url, token, hello=list, on_frame=ignore, backoff=Backoff(0.05, 0.2, seed=1))
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
    assert SECRET not in text
