"""An engine's counters file in a stats dir it cannot write (read-only or full state dir): the
engine log gets one line per run of failures, not one per write."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from serving.aqua.offload.stats import StatsFile


def test_it_logs_an_unwritable_stats_file_once_until_it_can_write_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "aqua-stats"
    blocker.write_text("")  # a file where the directory should be: every write fails
    stats = StatsFile(blocker / "offload-worker.json", min_interval_s=0.0)
    stats.close()  # written synchronously from here on: deterministic
    with caplog.at_level(logging.INFO, logger="serving.aqua.offload.stats"):
        for i in range(20):
            stats.publish({"saves": i})
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "could not write" in warnings[0].getMessage()

        blocker.unlink()  # the operator fixed the state dir
        stats.publish({"saves": 20})
        assert (blocker / "offload-worker.json").read_text() == '{"saves": 20}'
        assert any("again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)

        blocker.joinpath("offload-worker.json").unlink()
        blocker.rmdir()
        blocker.write_text("")  # broken again: warned again, once
        for i in range(5):
            stats.publish({"saves": 21 + i})
        assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 2
