"""`SimEngine`: one serving-simulator engine advanced in one-second chunks, with per-second metrics.

The simulator (`serving.sim.EngineSim`) keeps its state between `run()` calls, so each chunk feeds
it the requests arriving in [t, t + 1) and runs it until t + 1. Request records are the simulator's
own objects and keep filling in later chunks; each chunk's TTFT / inter-token figures are those of
the tokens emitted inside it (the window [t, t + 1)).

Telemetry takes the seconds simulated since its previous take (`take_window`), combined: ticks on
the wall clock and simulated seconds drift apart, so a tick may find no new second (reporting the
last one again counted its tokens twice) or two (reporting only the last lost the other).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from gpu_agent.protocol import EngineSample, LatencySummary
from serving.costmodel.gpus import get_gpu
from serving.costmodel.model import CostModel
from serving.costmodel.transfer import nvlink
from serving.metrics.latency import percentile
from serving.metrics.records import RequestRecord
from serving.policies import get_policy
from serving.sim import PEER_CAPACITY, EngineConfig, EngineSim, TimedChange
from serving.sim.preemption import DramStore, PeerStore
from serving.sim.state import SimRequest
from serving.workload.factory import make_workload
from serving.workload.request import Request

SEGMENT_S = 60.0  # workloads are generated a minute at a time, lazily
RECORD_HORIZON_S = 600.0  # records older than this are dropped even if they never finished


class WorkloadStream:
    """An endless workload: `make_workload` segments of SEGMENT_S, seeded per segment, renumbered."""

    def __init__(self, kind: str, rate: float, seed: int, dataset: str = "sharegpt", **kw: Any) -> None:
        self.kind, self.rate, self.seed, self.dataset, self.kw = kind, rate, seed, dataset, kw
        self._pending: list[Request] = []
        self._segments = 0
        self._next_id = 0

    def take_until(self, t: float) -> list[Request]:
        """Requests arriving before `t` not yet taken, in arrival order."""
        while self._segments * SEGMENT_S < t:
            start = self._segments * SEGMENT_S
            seg_seed = self.seed * 1_000_003 + self._segments
            for r in make_workload(self.kind, self.rate, SEGMENT_S, self.dataset, seg_seed, **self.kw):
                self._pending.append(
                    Request(self._next_id, start + r.arrival, r.prompt_tokens, r.output_tokens, r.slo_class)
                )
                self._next_id += 1
            self._segments += 1
        cut = bisect.bisect_left([r.arrival for r in self._pending], t)
        taken, self._pending = self._pending[:cut], self._pending[cut:]
        return taken


class CountingPeerStore(PeerStore):
    """A PeerStore that also counts every byte saved (offloaded) since the start."""

    saved_bytes = 0

    def save(self, req: SimRequest, nbytes: int) -> float:
        self.saved_bytes += nbytes
        return super().save(req, nbytes)


class CountingDramStore(DramStore):
    saved_bytes = 0

    def save(self, req: SimRequest, nbytes: int) -> float:
        self.saved_bytes += nbytes
        return super().save(req, nbytes)


@dataclass(frozen=True, slots=True)
class Window:
    """What one simulated second looked like."""

    ttft: LatencySummary
    itl: LatencySummary
    busy_fraction: float  # share of the second spent in engine iterations


def _summary(values: list[float]) -> LatencySummary:
    if not values:
        return LatencySummary(count=0)
    return LatencySummary(len(values), percentile(values, 50), percentile(values, 99))


class SimEngine:
    """One simulated engine (one deployment) on one or more simulated GPUs."""

    def __init__(
        self,
        engine_id: str,
        cost: CostModel,
        config: EngineConfig,
        workload: WorkloadStream,
        *,
        gpu: str,
        policy: str = "fcfs",
        start_s: float = 0.0,
    ) -> None:
        """
        Args:
            engine_id: Reported as the sample's deployment id.
            cost: Iteration latency model.
            config: Engine limits and preemption mode.
            workload: Its requests.
            gpu: Name of its GPU (serving/costmodel/gpus.py); lent memory is reached over that
                GPU's own NVLink (`costmodel.nvlink`: NVLink 3 on an A100, 4 on an H100).
            policy: Scheduling policy name (serving.policies registry).
            start_s: Simulated second it starts at (engines added to a running host); earlier
                arrivals of `workload` are skipped.
        """
        self.engine_id = engine_id
        self.config = config
        self.store: CountingPeerStore | CountingDramStore | None = None
        if config.preemption_mode == "offload_peer":
            self.store = CountingPeerStore(config.peer_capacity_bytes, nvlink(get_gpu(gpu).name))
        elif config.preemption_mode == "offload_dram":
            self.store = CountingDramStore()
        self.sim = EngineSim(cost, config, get_policy(policy), store=self.store, on_iteration=self._iter)
        self.workload = workload
        self.t = start_s  # simulated seconds done
        self.sim.now = start_s
        workload.take_until(start_s)
        self._records: list[RequestRecord] = []
        self._busy: list[tuple[float, float]] = []  # (start, duration) of iterations, this chunk
        self.last: Window = Window(LatencySummary(0), LatencySummary(0), 0.0)
        # Seconds simulated since the last take_window(): their latencies and busy time.
        self._untaken_ttft: list[float] = []
        self._untaken_itl: list[float] = []
        self._untaken_busy = 0.0
        self._untaken_seconds = 0
        self._changes: list[TimedChange] = []
        self._peer_capacity = config.peer_capacity_bytes

    def set_peer_capacity(self, nbytes: int) -> None:
        """Change the lent memory available to this engine from its next simulated second on."""
        if isinstance(self.store, CountingPeerStore) and nbytes != self._peer_capacity:
            self._peer_capacity = nbytes
            self._changes.append(TimedChange(self.t, PEER_CAPACITY, len(self._changes), nbytes))

    def _iter(self, start: float, duration: float, prefill: int, decodes: int, xfer: float) -> None:
        self._busy.append((start, duration))

    def advance(self) -> Window:
        """Simulate the next second, [t, t + 1); returns (and keeps in `last`) its figures."""
        t0, t1 = self.t, self.t + 1.0
        changes, self._changes = self._changes, []
        self._records += self.sim.run(self.workload.take_until(t1), changes=changes, until=t1)
        self.t = t1
        ttft: list[float] = []
        itl: list[float] = []
        keep: list[RequestRecord] = []
        for rec in self._records:
            times = rec.token_times
            if times and t0 <= times[0] < t1:
                ttft.append(times[0] - rec.arrival)
            lo = max(1, bisect.bisect_left(times, t0))
            hi = bisect.bisect_left(times, t1)
            itl.extend(times[i] - times[i - 1] for i in range(lo, hi))
            done = rec.finished and times[-1] < t1
            if not done and rec.arrival >= t1 - RECORD_HORIZON_S:
                keep.append(rec)
        self._records = keep
        busy = sum(min(s + d, t1) - max(s, t0) for s, d in self._busy if s + d > t0 and s < t1)
        self._busy = [(s, d) for s, d in self._busy if s + d > t1]
        self.last = Window(_summary(ttft), _summary(itl), min(1.0, max(0.0, busy)))
        self._untaken_ttft += ttft
        self._untaken_itl += itl
        self._untaken_busy += self.last.busy_fraction
        self._untaken_seconds += 1
        return self.last

    def take_window(self) -> Window:
        """Every second simulated since the previous call, as one window: latencies of all their
        tokens, the mean of their busy fractions. No second since then: no latencies, and the busy
        fraction of the last second (utilisation is a gauge)."""
        if not self._untaken_seconds:
            return Window(LatencySummary(0), LatencySummary(0), self.last.busy_fraction)
        window = Window(
            _summary(self._untaken_ttft),
            _summary(self._untaken_itl),
            min(1.0, self._untaken_busy / self._untaken_seconds),
        )
        self._untaken_ttft, self._untaken_itl = [], []
        self._untaken_busy, self._untaken_seconds = 0.0, 0
        return window

    @property
    def kv_usage(self) -> float:
        kv = self.sim.kv
        return (kv.total - kv.free) / kv.total if kv.total else 0.0

    @property
    def peer_used_bytes(self) -> int:
        return self.store.peer_used_bytes if isinstance(self.store, CountingPeerStore) else 0

    def sample(self, window: Window | None = None) -> EngineSample:
        """The engine now, with the latencies of `window` (default: the last simulated second)."""
        window = window or self.last
        return EngineSample(
            deployment_id=self.engine_id,
            state="running",
            ttft=window.ttft,
            itl=window.itl,
            kv_cache_usage=min(1.0, self.kv_usage),
            running=len(self.sim.running),
            waiting=len(self.sim.waiting),
            preemptions_total=self.sim.stats.preemptions,
            bytes_offloaded=self.store.saved_bytes if self.store is not None else 0,
        )
