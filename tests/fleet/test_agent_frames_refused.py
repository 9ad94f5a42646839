"""Frames that used to crash the agent consumer (daphne then closes the link with 1011) are answered
with an `error` frame, and the link stays up: JSON nested too deeply to decode, strings with NUL,
a `probe_result` the database refuses. A refused `probe_result` fails the probe it answers at once."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from agents import consumers
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from deployments.models import Deployment
from django.db import DataError
from django.test import override_settings
from inventory.models import Device, Host
from planning.models import ProbeRequest, ProbeStatus
from planning.relay import store_probe_result
from registry.models import ServedModel

from config.asgi import application
from gpu_agent.protocol import ProbeReport

from .conftest import AgentHost, register_frame

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_thread_connections"),
]
NO_SWEEP = override_settings(AGENTS_SWEEP_IN_ASGI=False, AGENTS_DESIRED_POLL_S=60.0)


@pytest_asyncio.fixture
async def link(agent_host: AgentHost) -> AsyncIterator[WebsocketCommunicator]:
    """A connected, registered agent link of host gpu-a; its first desired list consumed."""
    with NO_SWEEP:
        comm = WebsocketCommunicator(
            application, "/ws/agent/", headers=[(b"authorization", f"Bearer {agent_host.token}".encode())]
        )
        assert (await comm.connect())[0]
        await comm.send_json_to(register_frame())
        assert (await comm.receive_json_from(timeout=5))["type"] == "desired_deployments"
        yield comm
        await comm.disconnect()


async def still_up(comm: WebsocketCommunicator) -> None:
    """The link still answers: an unknown frame type gets its `error` frame."""
    await comm.send_to(text_data='{"v": 1, "type": "nope"}')
    answer = await comm.receive_json_from(timeout=5)
    assert (answer["type"], answer["field"]) == ("error", "type")


@database_sync_to_async
def open_probe(host: Host, probe_id: str = "probe-1") -> ProbeRequest:
    return ProbeRequest.objects.create(
        probe_id=probe_id, host=host, frame={"probe_id": probe_id}, status=ProbeStatus.SENT
    )


def probe_result(probe_id: str = "probe-1", **fields: Any) -> dict[str, Any]:
    return {"v": 1, "type": "probe_result", "probe_id": probe_id, "deployment_id": "1", "ok": True, **fields}


async def test_a_frame_nested_too_deeply_to_decode_is_answered_with_an_error(
    link: WebsocketCommunicator,
) -> None:
    await link.send_to(text_data="[" * 200_000 + "]" * 200_000)
    answer = await link.receive_json_from(timeout=5)
    assert (answer["type"], answer["code"]) == ("error", "bad_frame")
    assert "nested too deeply" in answer["message"]
    await still_up(link)


async def test_a_nul_character_in_a_probe_id_is_answered_with_an_error(link: WebsocketCommunicator) -> None:
    await link.send_json_to(probe_result("p\x00", ok=False))
    answer = await link.receive_json_from(timeout=5)
    assert (answer["type"], answer["code"], answer["field"]) == ("error", "bad_frame", "probe_id")
    await still_up(link)


async def test_a_lone_surrogate_in_a_probe_id_is_answered_with_an_error(link: WebsocketCommunicator) -> None:
    # The refused answer's probe was looked up to fail it: no database encodes the id (SQLite and
    # PostgreSQL raised UnicodeEncodeError, which ended the link with 1011).
    await link.send_json_to(probe_result("p\ud800", ok=False))
    answer = await link.receive_json_from(timeout=5)
    assert (answer["type"], answer["code"], answer["field"]) == ("error", "bad_frame", "probe_id")
    await still_up(link)


async def test_a_nul_character_in_a_registered_device_is_refused_before_the_database(
    agent_host: AgentHost, link: WebsocketCommunicator
) -> None:
    frame = register_frame()
    frame["devices"][1]["name"] = "NVIDIA\x00H100"
    await link.send_json_to(frame)
    answer = await link.receive_json_from(timeout=5)
    assert (answer["type"], answer["field"]) == ("error", "devices[1].name")
    names = await database_sync_to_async(list)(
        Device.objects.order_by("index").values_list("name", flat=True)
    )
    assert names == ["NVIDIA H100", "NVIDIA H100"]  # the first registration's, untouched
    await still_up(link)


async def test_a_lone_surrogate_in_a_status_or_a_device_is_answered_and_keeps_the_link(
    agent_host: AgentHost, link: WebsocketCommunicator, served_model: ServedModel
) -> None:
    # JSON's "\ud800" escape without its pair: storing it raised UnicodeEncodeError (no UTF-8
    # text holds it), which ended the link (1011); the agent re-sent the status on reconnecting.
    deployment = await database_sync_to_async(Deployment.objects.create)(
        model=served_model, host=agent_host.host, desired_state="stopped"
    )
    status = {"v": 1, "type": "deployment_status", "deployment_id": str(deployment.pk), "state": "failed"}
    await link.send_json_to({**status, "ts": time.time(), "error": "no such file: /models/\udcff"})
    answer = await link.receive_json_from(timeout=5)
    assert (answer["type"], answer["code"], answer["field"]) == ("error", "bad_frame", "error")
    assert "lone surrogate" in answer["message"]
    frame = register_frame()
    frame["devices"][1]["name"] = "NVIDIA\ud800H100"
    await link.send_json_to(frame)
    answer = await link.receive_json_from(timeout=5)
    assert (answer["type"], answer["field"]) == ("error", "devices[1].name")
    await deployment.arefresh_from_db()
    assert (deployment.observed_state, deployment.observed_message) == ("pending", "")  # nothing stored
    await still_up(link)


async def test_a_refused_probe_result_fails_its_probe_at_once(
    agent_host: AgentHost, link: WebsocketCommunicator
) -> None:
    other = await database_sync_to_async(Host.objects.create)(name="gpu-b")
    await open_probe(other, "probe-of-b")
    await open_probe(agent_host.host)
    # Another host's probe is not this agent's to fail.
    await link.send_json_to(probe_result("probe-of-b", num_requests=-1))
    assert (await link.receive_json_from(timeout=5))["field"] == "num_requests"
    await link.send_json_to(probe_result(ok=False, error="engine log: \x00"))
    answer = await link.receive_json_from(timeout=5)
    assert (answer["type"], answer["field"]) == ("error", "error")
    rows = await database_sync_to_async(lambda: {r.probe_id: r for r in ProbeRequest.objects.all()})()
    assert rows["probe-of-b"].status == ProbeStatus.SENT
    # The profiling worker polling this row fails now, instead of after the probe's timeout.
    row = rows["probe-1"]
    assert row.status == ProbeStatus.FAILED and row.finished_at is not None
    assert "refused the agent's probe_result" in row.error and "error: must not contain a NUL" in row.error
    await still_up(link)


async def test_a_probe_result_the_database_refuses_is_answered_and_fails_its_probe(
    agent_host: AgentHost, link: WebsocketCommunicator, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refusing(host_id: int, frame: ProbeReport) -> bool:
        if frame.ok:  # the agent's answer; the failure recorded after it goes through
            raise DataError("value out of range")
        return store_probe_result(host_id, frame)

    monkeypatch.setattr(consumers, "store_probe_result", refusing)
    await open_probe(agent_host.host)
    await link.send_json_to(probe_result())
    answer = await link.receive_json_from(timeout=5)
    assert (answer["type"], answer["code"]) == ("error", "bad_frame")
    assert "cannot store the probe result: value out of range" in answer["message"]
    row = await database_sync_to_async(ProbeRequest.objects.get)(probe_id="probe-1")
    assert row.status == ProbeStatus.FAILED and "cannot store it: value out of range" in row.error
    await still_up(link)
