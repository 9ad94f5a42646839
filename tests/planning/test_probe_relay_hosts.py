"""One probe poller per event loop serves every connected agent (planning/relay.py): each host's
connection gets exactly its own pending probes, a host that connects later is served by the same
poller, and a probe of a host with no connection here stays pending for another process."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import override_settings
from inventory.models import Host
from inventory.services import register_host
from planning import relay
from planning.models import ProbeRequest, ProbeStatus

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_thread_connections"),
]
FAST = override_settings(PLANNING_PROBE_POLL_S=0.05)


@database_sync_to_async
def hosts(*names: str) -> list[Host]:
    return [register_host(name, "127.0.0.1") for name in names]


@database_sync_to_async
def add_probe(host: Host, probe_id: str) -> None:
    ProbeRequest.objects.create(probe_id=probe_id, host=host, frame={"type": "probe", "probe_id": probe_id})


@database_sync_to_async
def status(probe_id: str) -> str:
    return str(ProbeRequest.objects.get(probe_id=probe_id).status)


class Inbox:
    """A connection's `send`: collects the frames relayed to it."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()

    async def __call__(self, frame: dict[str, Any]) -> None:
        self.frames.append(frame)
        self.arrived.set()

    async def ids(self, count: int) -> list[str]:
        while len(self.frames) < count:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 30)  # a bound, so a broken relay fails
        return [f["probe_id"] for f in self.frames]


async def test_each_connected_host_gets_its_own_probes_from_one_poller() -> None:
    with FAST:
        a, b, away = await hosts("gpu-a", "gpu-b", "gpu-c")
        inbox_a, inbox_b = Inbox(), Inbox()
        tasks = [asyncio.create_task(relay.relay_probes(a.pk, inbox_a))]
        await add_probe(a, "a1")
        await add_probe(away, "c1")
        assert await inbox_a.ids(1) == ["a1"]
        tasks.append(asyncio.create_task(relay.relay_probes(b.pk, inbox_b)))  # joins the same poller
        await add_probe(b, "b1")
        await add_probe(a, "a2")
        assert await inbox_b.ids(1) == ["b1"]
        assert await inbox_a.ids(2) == ["a1", "a2"]
        assert len({id(r.task) for r in relay._relays.values() if r.task is not None}) == 1
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert (inbox_a.frames[2:], inbox_b.frames[1:]) == ([], [])
        assert await status("c1") == ProbeStatus.PENDING  # no connection here: left for another process
        assert await status("b1") == ProbeStatus.SENT
