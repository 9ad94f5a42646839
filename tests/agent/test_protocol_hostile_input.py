"""Frames that used to escape the protocol's validation: JSON nested too deeply for the decoder, and
strings with NUL (which PostgreSQL refuses). Both are bad frames, answered with an `error`; the
agent never sends NUL itself; `register` announces the agent's heartbeat interval, bounded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpu_agent.agent import Agent
from gpu_agent.protocol import (
    MAX_HEARTBEAT_INTERVAL_S,
    Command,
    DeploymentStatus,
    LogTail,
    ProtocolError,
    Register,
    dumps,
    loads,
    parse_frame,
)
from tests.agent.test_link import REGISTER, Harness
from tests.agent.test_link_robustness import make_agent, running_agent, server  # noqa: F401
from tests.agent.ws_server import ControlPlaneStub, wait_for

DEEP = "[" * 200_000 + "]" * 200_000


def register(**extra: Any) -> dict[str, Any]:
    """REGISTER as an agent from before `heartbeat_interval_s` sent it, with ``extra`` fields."""
    frame = REGISTER.to_dict()
    frame.pop("heartbeat_interval_s", None)
    return {**frame, **extra}


def test_it_refuses_json_nested_too_deeply_to_decode_as_a_bad_frame() -> None:
    for text in (DEEP, '{"v": 1, "type": "heartbeat", "ts": ' + DEEP + "}"):
        with pytest.raises(ProtocolError) as refused:
            loads(text, sender="agent")
        assert refused.value.field == "" and "nested too deeply" in refused.value.reason


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        (
            {"v": 1, "type": "probe_result", "probe_id": "p\x00", "deployment_id": "1", "ok": False},
            "probe_id",
        ),
        (
            {
                "v": 1,
                "type": "probe_result",
                "probe_id": "p",
                "deployment_id": "1",
                "ok": False,
                "error": "a\x00b",
            },
            "error",
        ),
        ({"v": 1, "type": "log_tail", "deployment_id": "1", "lines": ["ok", "bad\x00"]}, "lines[1]"),
        (register(host="host\x00a"), "host"),
        (register(devices=[{**REGISTER.to_dict()["devices"][0], "uuid": "GPU-\x00"}]), "devices[0].uuid"),
    ],
)
def test_it_refuses_a_nul_character_in_any_string_of_an_agent_frame(
    frame: dict[str, Any], field: str
) -> None:
    with pytest.raises(ProtocolError) as refused:
        parse_frame(json.loads(json.dumps(frame)), sender="agent")
    assert refused.value.field == field
    assert "NUL" in refused.value.reason and "\x00" not in str(refused.value)  # never echoed back


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        (
            {"v": 1, "type": "deployment_status", "deployment_id": "1", "state": "failed", "ts": 1.0}
            | {"error": "no such file: /m/\udcff"},
            "error",
        ),
        (register(devices=[{**REGISTER.to_dict()["devices"][0], "name": "H100\ud800"}]), "devices[0].name"),
        ({"v": 1, "type": "log_tail", "deployment_id": "1", "lines": ["\udc80"]}, "lines[0]"),
    ],
)
def test_it_refuses_a_lone_surrogate_in_any_string_of_an_agent_frame(
    frame: dict[str, Any], field: str
) -> None:
    # JSON's "\ud800" escape without its pair: no UTF-8 text holds it, so storing it raised
    # UnicodeEncodeError in the agent's consumer, which ended the link (1011).
    with pytest.raises(ProtocolError) as refused:
        parse_frame(json.loads(json.dumps(frame)), sender="agent")
    assert refused.value.field == field
    assert "lone surrogate" in refused.value.reason


def test_a_surrogate_pair_is_the_character_it_encodes_and_stands() -> None:
    frame = {"v": 1, "type": "log_tail", "deployment_id": "1", "lines": ["\ud83d\ude00"]}
    parsed = parse_frame(json.loads(json.dumps(frame)), sender="agent")
    assert isinstance(parsed, LogTail) and parsed.lines == ["\U0001f600"]


def test_it_refuses_a_nul_character_in_an_object_key_and_never_echoes_it() -> None:
    desired = {
        "v": 1,
        "type": "desired_deployments",
        "deployments": [
            {
                "id": "1",
                "model": {"name": "m", "source": "/m", "engine_options": {"seed\x00": 1}},
                "devices": [0],
            }
        ],
    }
    with pytest.raises(ProtocolError) as refused:
        parse_frame(desired, sender="control_plane")
    assert refused.value.field == "deployments[0].model.engine_options"
    with pytest.raises(ProtocolError) as unknown:
        parse_frame({"v": 1, "type": "heartbeat", "ts": 1.0, "x\x00": 1})
    assert "\x00" not in unknown.value.field


def test_register_carries_an_optional_bounded_heartbeat_interval() -> None:
    assert parse_frame(register()) == REGISTER  # an older agent leaves it out
    assert REGISTER.heartbeat_interval_s is None
    framed = parse_frame(register(heartbeat_interval_s=5))
    assert isinstance(framed, Register) and framed.heartbeat_interval_s == 5.0
    assert parse_frame(register(heartbeat_interval_s=MAX_HEARTBEAT_INTERVAL_S)) is not None
    for bad in (0, -1.0, MAX_HEARTBEAT_INTERVAL_S + 1):
        with pytest.raises(ProtocolError) as refused:
            parse_frame(register(heartbeat_interval_s=bad))
        assert refused.value.field == "heartbeat_interval_s"


def test_the_agent_announces_its_interval_and_refuses_one_the_control_plane_would_not_take(
    tmp_path: Path,
    server: ControlPlaneStub,  # noqa: F811
) -> None:
    assert make_agent(tmp_path, server, telemetry_interval_s=5.0).register_frame().heartbeat_interval_s == 5.0
    with pytest.raises(ValueError, match="telemetry_interval_s=61"):
        make_agent(tmp_path, server, telemetry_interval_s=61.0)


# The fields of `register` before `heartbeat_interval_s`: a control plane of that time refuses
# any other (unknown fields are errors), whatever its value, null included.
REGISTER_FIELDS_BEFORE_THE_INTERVAL = {
    "v",
    "type",
    "host",
    "address",
    "agent_version",
    "simulated",
    "devices",
}


def test_an_agent_on_the_default_beat_still_registers_with_a_control_plane_that_predates_the_interval(
    tmp_path: Path,
    server: ControlPlaneStub,  # noqa: F811
) -> None:
    frame = make_agent(tmp_path, server, telemetry_interval_s=1.0).register_frame()
    assert set(json.loads(dumps(frame))) <= REGISTER_FIELDS_BEFORE_THE_INTERVAL
    assert parse_frame(json.loads(dumps(frame))) == frame  # and reads back as the default
    slow = make_agent(tmp_path, server, telemetry_interval_s=5.0).register_frame()
    assert json.loads(dumps(slow))["heartbeat_interval_s"] == 5.0  # the one case that must say it


@pytest.mark.asyncio
async def test_the_agent_answers_a_deeply_nested_frame_with_an_error_and_keeps_the_link(
    server: ControlPlaneStub,  # noqa: F811
) -> None:
    h = Harness(server)
    async with h.running() as link:
        await wait_for(lambda: link.connected)
        await server.push(DEEP)
        await server.push(dumps(Command("c1", "tail_log", "d1", lines=5)))
        await wait_for(lambda: len(h.received) == 1)
        assert link.connected and link.stats.connects == 1
    (error,) = server.of_type("error")
    assert error["code"] == "bad_frame" and "nested too deeply" in error["message"]
    assert link.stats.rejected_frames == 1


@pytest.mark.asyncio
async def test_the_agent_replaces_nul_in_the_log_lines_and_status_errors_it_sends(
    tmp_path: Path,
    server: ControlPlaneStub,  # noqa: F811
) -> None:
    log = tmp_path / "logs" / "d1.log"
    log.parent.mkdir()
    log.write_bytes(b"starting\nbinary \x00 garbage\n")
    agent: Agent = make_agent(tmp_path, server)
    async with running_agent(agent):
        await wait_for(lambda: agent.link.connected)
        await server.push(dumps(Command("c1", "tail_log", "d1", lines=10)))
        agent._statuses.put_nowait(DeploymentStatus("d9", "failed", 1.0, error="engine died: \x00\x01"))
        # An OSError's message names a file by its undecodable bytes as lone surrogates.
        bad_path = b"/models/\xff".decode(errors="surrogateescape")
        agent._statuses.put_nowait(DeploymentStatus("d8", "failed", 1.0, error=f"no such file: {bad_path}"))
        await wait_for(lambda: server.of_type("log_tail") and len(server.of_type("deployment_status")) >= 2)
    (tail,) = server.of_type("log_tail")
    assert tail["lines"] == ["starting", "binary \ufffd garbage"]
    status = next(s for s in server.of_type("deployment_status") if s["deployment_id"] == "d9")
    assert status["error"] == "engine died: \ufffd\x01"
    named = next(s for s in server.of_type("deployment_status") if s["deployment_id"] == "d8")
    assert named["error"] == "no such file: /models/\ufffd"
    for frame in (tail, status, named):  # what the control plane accepts
        parse_frame(frame, sender="agent")
