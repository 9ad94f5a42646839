"""The Aqua scheduler's counters file (scheduler.json) is current once requests end, also when
nothing was preempted and when a request is aborted: tests and benchmarks read it after a run,
when the engine may take no further step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serving.aqua.offload.stats import read_json
from tests.vllm_aqua import bare_scheduler
from tests.vllm_aqua.engines import AQUA_SCHEDULER


def _scheduler(stats: Path) -> Any:
    from vllm.utils.import_utils import resolve_obj_by_qualname

    cls = resolve_obj_by_qualname(AQUA_SCHEDULER)
    return bare_scheduler.make_scheduler(
        cls, max_num_seqs=4, num_blocks=64, additional={"aqua_stats_dir": str(stats)}
    )


def test_counters_are_published_when_requests_finish_without_a_preemption(tmp_path: Path) -> None:
    s = _scheduler(tmp_path)
    s.add_request(bare_scheduler.make_request("a", 20, 3, arrival_time=0.0))
    steps = 0
    while s.has_requests():
        bare_scheduler.step(s)
        steps += 1
    counters = read_json(tmp_path / "scheduler.json", settle_s=0.3)
    assert counters["steps"] == steps and counters["preemptions"] == 0
    assert counters["prefill_tokens"] == 20


def test_counters_are_published_after_an_abort(tmp_path: Path) -> None:
    from vllm.v1.request import RequestStatus

    s = _scheduler(tmp_path)
    s.add_request(bare_scheduler.make_request("a", 20, 50, arrival_time=0.0))
    bare_scheduler.step(s)
    s.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    while s.has_requests():  # the engine's last step tells the workers (and the connector)
        bare_scheduler.step(s)
    counters = read_json(tmp_path / "scheduler.json", settle_s=0.3)
    assert counters["steps"] == 2 and counters["prefill_tokens"] == 20
