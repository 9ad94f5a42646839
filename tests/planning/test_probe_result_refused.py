"""A profiling worker waiting for a probe's answer fails as soon as the agent's `probe_result` is
refused (a bad frame), naming why, instead of waiting out the probe's timeout (ten minutes by
default, plus the relay margin) for an answer that already came."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from planning.engine_probe import AgentEngineProbe

from serving.profiler import ProbeResult, ProfilingError
from tests.planning.test_probe_relay import (
    SETTINGS,
    WORKLOAD,
    Measure,
    connect,
    next_probe,
    running_deployment,
    setup_host,
)

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_worker_thread_connections"),
]


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({"ok": False, "error": "engine log: \x00\x00"}, "error: must not contain a NUL character"),
        ({"ok": True, "finished": -1}, "finished: must be >= 0"),
    ],
)
async def test_a_refused_probe_result_fails_the_waiting_probe_at_once(
    bad: dict[str, Any], named: str
) -> None:
    with SETTINGS:
        host, token = await setup_host()
        comm = await connect(token)
        deployment = await running_deployment(host)
        probe = AgentEngineProbe(deployment, WORKLOAD, poll_s=0.05, timeout_s=30)

        def measure() -> ProbeResult:
            try:
                return probe.measure(1.0)
            finally:
                connection.close()  # the worker thread's own connection

        measuring = Measure(measure)
        measuring.start()
        frame = await next_probe(comm)
        answer = {
            "v": 1,
            "type": "probe_result",
            "probe_id": frame["probe_id"],
            "deployment_id": frame["deployment_id"],
        }
        await comm.send_json_to({**answer, **bad})
        error = await comm.receive_json_from(timeout=5)
        while error["type"] == "desired_deployments":  # a push for the deployment may come late
            error = await comm.receive_json_from(timeout=5)
        assert (error["type"], error["code"]) == ("error", "bad_frame")
        await measuring.wait()  # well before the probe's 30 s (+ 60 s margin) deadline
        assert isinstance(measuring.error, ProfilingError)
        assert "refused the agent's probe_result" in str(measuring.error) and named in str(measuring.error)
        await comm.disconnect()
