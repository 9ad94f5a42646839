"""The Aqua connector's counters file is read by the agent into `bytes_offloaded`: a value that is no
count the control plane stores (`true`, >= 2**63, negative, not an integer) is left out, with one
warning per engine run. It went into the telemetry frame, and the control plane refused the host's
whole frame every tick."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from gpu_agent.engines.supervisor import EngineSupervisor
from gpu_agent.protocol import EngineSample, Telemetry, dumps, loads
from tests.agent.test_engines import spec


def supervisor(tmp_path: Path, counters: object) -> EngineSupervisor:
    sup = EngineSupervisor(spec(), lambda s, p: None, str(tmp_path / "d1.log"), lambda s: None)  # type: ignore[arg-type,return-value]
    stats = tmp_path / "offload-worker.json"
    stats.write_text(json.dumps(counters))
    sup._offload_stats = str(stats)
    return sup


def frame_with(offloaded: int) -> object:
    """The telemetry frame as the control plane decodes it (ProtocolError if it refuses it)."""
    sample = EngineSample("d1", "running", bytes_offloaded=offloaded)
    return loads(dumps(Telemetry(ts=1_700_000_000.0, devices=[], engines=[sample])), sender="agent")


@pytest.mark.parametrize("bad", [True, False, 2**63, 2**64 + 5, -1, 1.5, "4096", None, [1]])
def test_it_drops_a_value_that_is_no_count_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: object
) -> None:
    sup = supervisor(tmp_path, {"bytes_offloaded": bad, "saves": 3})
    with caplog.at_level(logging.WARNING, logger="gpu_agent.engines.supervisor"):
        first, second = sup._connector_offloaded_bytes(), sup._connector_offloaded_bytes()
    assert (first, second) == (0, 0) and type(first) is int
    frame_with(first)  # the control plane takes the frame
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "d1" in warning and "bytes_offloaded" in warning and "offload-worker.json" in warning


@pytest.mark.parametrize("good", [0, 4096, 2**63 - 1])
def test_it_keeps_every_count_the_control_plane_stores(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, good: int
) -> None:
    sup = supervisor(tmp_path, {"bytes_offloaded": good})
    with caplog.at_level(logging.WARNING):
        assert sup._connector_offloaded_bytes() == good
    frame_with(good)
    assert caplog.records == []


def test_counters_that_are_no_mapping_read_as_none(tmp_path: Path) -> None:
    assert supervisor(tmp_path, [1, 2])._connector_offloaded_bytes() == 0
