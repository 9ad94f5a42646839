"""Through real daphne and the agent's real link: while the control plane's database cannot take the
agent's `register` (its writes are locked, so the register times out), the agent sees its link closed
with 4503 (try again), logs it as down and retries with backoff; it reports no refusal. Once the database
takes writes again, the next attempt registers.

On PostgreSQL only the hosts table is locked, so a control plane that took the timeout for a refusal
could still count it and send `register_refused`; SQLite locks the whole database, which also
stops that count's write, so there the control plane's log line is what tells the two apart."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from typing import Any

import psycopg
import pytest
from agents.models import AgentLink
from django.db import connection
from inventory.models import Device, Host
from inventory.services import issue_agent_token, register_host

from gpu_agent.link import AgentLink as Link
from gpu_agent.protocol import DeviceInfo, ErrorFrame, Frame, Register
from serving.backoff import Backoff
from tests.agent.ws_server import wait_for

from .servers import AsgiServer

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

HOST = "db-outage"
REGISTER = Register(HOST, "127.0.0.1", "test", False, [DeviceInfo(0, f"CPU-{HOST}", "cpu", "cpu", 2**30)])


class WriteLock:
    """Another session holding the write lock on the hosts the register updates, on this test's
    database; `server_env` makes the server give up waiting for it after a second."""

    def __init__(self) -> None:
        self.settings = connection.settings_dict
        self._conn: Any = None

    @property
    def server_env(self) -> dict[str, str]:
        if connection.vendor == "sqlite":
            return {"DATABASE_URL": f"sqlite:///{self.settings['NAME']}?timeout=1"}
        return {"PGOPTIONS": "-c lock_timeout=1000"}

    def acquire(self) -> None:
        if connection.vendor == "sqlite":
            self._conn = sqlite3.connect(self.settings["NAME"], isolation_level=None)
            self._conn.execute("BEGIN IMMEDIATE")  # the database's one write lock; reads go on
            return
        s = self.settings
        self._conn = psycopg.connect(
            host=s["HOST"] or None, port=s["PORT"] or None, user=s["USER"], password=s["PASSWORD"],
            dbname=s["NAME"],
        )  # fmt: skip
        self._conn.execute(f"LOCK TABLE {Host._meta.db_table} IN EXCLUSIVE MODE")  # reads go on

    def release(self) -> None:
        self._conn.rollback()
        self._conn.close()


async def outage_then_recovery(url: str, token: str, lock: WriteLock) -> tuple[Link, list[Frame]]:
    received: list[Frame] = []

    async def on_frame(frame: Frame) -> None:
        received.append(frame)

    link = Link(
        url,
        token,
        hello=lambda: [REGISTER],
        on_frame=on_frame,
        backoff=Backoff(base_s=0.2, cap_s=1.0, seed=7),
    )
    lock.acquire()
    task = asyncio.create_task(link.run())
    try:
        await wait_for(lambda: link.stats.failed_attempts >= 2, timeout=120)
        lock.release()
        await wait_for(lambda: any(f.TYPE == "desired_deployments" for f in received), timeout=120)
    finally:
        link.stop()
        await asyncio.wait_for(task, 30)
    return link, received


def test_an_agent_retries_a_register_the_database_could_not_take_without_reporting_a_refusal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    host = register_host(HOST, "127.0.0.1")
    token = issue_agent_token(host).plaintext
    lock = WriteLock()
    server = AsgiServer(AGENTS_SWEEP_IN_ASGI="false", **lock.server_env)
    server.start()
    try:
        with caplog.at_level(logging.WARNING, logger="gpu_agent.link"):
            link, received = asyncio.run(outage_then_recovery(server.url, token, lock))
    finally:
        server.stop()
    assert link.stats.register_refusals == 0 and link.stats.auth_refusals == 0
    assert not [f for f in received if isinstance(f, ErrorFrame)]
    records = [r for r in caplog.records if r.name == "gpu_agent.link"]
    assert not [r.getMessage() for r in records if r.levelno >= logging.ERROR]
    downs = [r.getMessage() for r in records if "down" in r.getMessage()]
    assert len(downs) >= 2, downs
    assert all("cannot serve this agent now (close code 4503" in m for m in downs[:2]), downs
    assert f"Could not store the register of the agent of {HOST} now" in server.log()
    assert "Exception inside application" not in server.log()  # a close, not a handler that raised
    assert Device.objects.filter(host=host).exists()
    assert AgentLink.objects.get(host=host).frames_rejected == 0
