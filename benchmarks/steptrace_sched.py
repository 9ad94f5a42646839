"""Schedulers that log every engine step, for benchmarks/aqua_steptrace.py.

`TracingScheduler` (vLLM's default) and `TracingAquaScheduler` (ours) behave exactly like the
classes they extend and append one JSON line per event to the file named by the engine's
`additional_config["steptrace_file"]` (the engine-core process's pid is appended):

    {"ev": "add", "t": ..., "id": ...}                       a request reached the scheduler
    {"ev": "sched", "t0": ..., "t1": ..., "n": ..., "tok": ..., "ids": [...], "new": [...],
     "resumed": k, "preempted": k}                           one schedule() call
    {"ev": "upd", "t0": ..., "t1": ...}                      the step's update_from_output()

Times are wall-clock seconds (time.time()), the clock the benchmark's process stamps its requests
with, so the two sides line up. Benchmarks only: the trace costs a JSON line per step.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, TextIO

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from serving.vllm_ext.scheduler import AquaScheduler


class _StepTrace:
    """Mixin over a vLLM Scheduler: log requests' arrivals, each step's batch and its update."""

    _trace: TextIO | None

    def _trace_file(self) -> TextIO | None:
        if not hasattr(self, "_trace"):
            extra = getattr(self, "vllm_config").additional_config  # noqa: B009 (mixin)
            path = extra.get("steptrace_file") if isinstance(extra, dict) else None
            self._trace = open(f"{path}.{os.getpid()}", "a", buffering=1) if path else None  # noqa: SIM115
        return self._trace

    def _log(self, record: dict[str, Any]) -> None:
        f = self._trace_file()
        if f is not None:
            f.write(json.dumps(record) + "\n")

    def add_request(self, request: Request) -> None:
        self._log({"ev": "add", "t": time.time(), "id": request.request_id})
        super().add_request(request)  # type: ignore[misc]

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        t0 = time.time()
        out: SchedulerOutput = super().schedule(throttle_prefills)  # type: ignore[misc]
        t1 = time.time()
        self._log(
            {
                "ev": "sched",
                "t0": t0,
                "t1": t1,
                "n": len(out.num_scheduled_tokens),
                "tok": out.total_num_scheduled_tokens,
                "ids": list(out.num_scheduled_tokens),
                "new": [r.req_id for r in out.scheduled_new_reqs],
                "resumed": len(out.scheduled_cached_reqs.resumed_req_ids),
                "preempted": len(out.preempted_req_ids or ()),
            }
        )
        return out

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        t0 = time.time()
        result = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        self._log({"ev": "upd", "t0": t0, "t1": time.time()})
        return result


class TracingScheduler(_StepTrace, Scheduler):
    """vLLM's default scheduler, traced."""


class TracingAquaScheduler(_StepTrace, AquaScheduler):
    """The Aqua scheduler, traced."""
