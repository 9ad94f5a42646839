"""`SimulatedHost`: a host of N simulated GPUs whose engines the serving simulator drives.

`python -m gpu_agent --simulate 8xH100 ...` registers such a host (`simulated: true` in register,
telemetry and statuses). Its scenario, built from public figures (serving.costmodel presets):
  - devices 0, 2, 4, ... run a *consumer*: `sim_model` under a bursty workload (base `rate`
    requests/s, 4x bursts of 10 s every minute), KV cache = what fits beside the weights in 90% of
    the GPU (vLLM's default gpu_memory_utilization); preempted KV goes to the memory its paired
    producer lends (over NVLink), DRAM when that is full;
  - devices 1, 3, 5, ... run a *producer*: llama-3-8b at rate/4, using 50% of its GPU, lending
    40% of it to the consumer on the device before it; an odd device out runs a plain engine.
  - The control plane may also place deployments here: a deployment on devices D replaces the
    built-in engines of D with a simulated engine of its model (preset by model name, else
    `sim_model`; Poisson at engine_options["sim_rate"] or `rate`), tensor-parallel over D.
    Built-in engines report in telemetry as "sim:<device>" and send no deployment_status.
Every telemetry tick advances each engine, in one-second chunks, up to the wall-clock seconds
elapsed since start, and reports every second advanced since the previous tick once: latencies of
all their tokens, utilisation the mean busy share of those seconds (the last second's when none
was); temperature and power are synthetic (linear in utilisation between idle and the part's TDP).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from gpu_agent.config import MAX_SIM_RATE, parse_simulate_spec
from gpu_agent.host import Host, StatusCallback
from gpu_agent.protocol import (
    AquaRole,
    DeploymentSpec,
    DeploymentState,
    DeploymentStatus,
    DeviceInfo,
    DeviceSample,
    EngineSample,
)
from gpu_agent.sim_engine import SimEngine, WorkloadStream
from serving.costmodel.config import MODEL_CONFIGS
from serving.costmodel.gpus import get_gpu
from serving.costmodel.presets import get_preset, kv_capacity_tokens
from serving.sim import EngineConfig

log = logging.getLogger(__name__)

TDP_W = {"H100": 700.0, "H200": 700.0, "A100": 400.0}  # SXM parts, NVIDIA datasheets
IDLE_W = 70.0
PRODUCER_MODEL = "llama-3-8b"
PRODUCER_MEM_UTIL = 0.5
LEND_FRACTION = 0.4
CONSUMER_MEM_UTIL = 0.9
BLOCK = 16


@dataclass
class _Placed:
    """An engine and the devices it runs on."""

    engine: SimEngine
    devices: list[int]
    role: AquaRole
    mem_util: float  # fraction of each device the engine reserves
    lent_bytes: int = 0  # producers: bytes lent to `peer`
    peer: int | None = None
    spec: DeploymentSpec | None = None  # None for built-in engines


class SimulatedHost(Host):
    """N simulated GPUs of one kind, all NVLink peers of each other."""

    simulated = True

    def __init__(
        self, spec: str, *, model: str = "llama-2-13b", rate: float = 6.0, seed: int = 0, name: str = "sim"
    ) -> None:
        self.count, self.kind = parse_simulate_spec(spec)
        self.gpu = get_gpu(self.kind.lower())
        get_preset(model, self.gpu.name)  # unknown model / does not fit: ValueError now
        self.model, self.rate, self.seed, self.name = model, rate, seed, name
        self._builtin: dict[int, _Placed] = {}  # lead device -> built-in engine
        self._deployed: dict[str, _Placed] = {}  # deployment id -> engine
        self._failed: dict[str, DeploymentStatus] = {}
        self._on_status: StatusCallback = lambda s: None
        self._t0 = 0.0
        self._sim_now = 0.0  # simulated seconds the host has advanced to
        self._closed = False  # stop() was called: apply() starts nothing

    # ---- scenario -----------------------------------------------------------------------------

    def _engine(
        self,
        engine_id: str,
        model: str,
        devices: list[int],
        mem_util: float,
        workload: WorkloadStream,
        peer_bytes: int = 0,
    ) -> SimEngine:
        tp = len(devices)
        cost = get_preset(model, self.gpu.name, tp)
        blocks = max(1, kv_capacity_tokens(model, self.gpu, tp, mem_util) // BLOCK)
        mode = "offload_peer" if peer_bytes else "recompute"
        config = EngineConfig(num_kv_blocks=blocks, block_size=BLOCK, preemption_mode=mode,
                              peer_capacity_bytes=peer_bytes)  # fmt: skip
        start_s = float(int(self._sim_now))
        return SimEngine(engine_id, cost, config, workload, gpu=self.gpu.name, start_s=start_s)

    def _build_builtin(self, device: int) -> _Placed:
        mem = self.gpu.memory_bytes
        seed = self.seed * 1000 + device
        paired = device + 1 < self.count if device % 2 == 0 else True
        if device % 2 == 0 and paired:
            lent = int(LEND_FRACTION * mem)
            stream = WorkloadStream(
                "burst", self.rate, seed, burst_factor=4.0, burst_duration_s=10.0, period_s=60.0
            )
            eng = self._engine(f"sim:{device}", self.model, [device], CONSUMER_MEM_UTIL, stream, lent)
            return _Placed(eng, [device], "consumer", CONSUMER_MEM_UTIL, peer=device + 1)
        if device % 2 == 1:
            stream = WorkloadStream("poisson", self.rate / 4, seed)
            eng = self._engine(f"sim:{device}", PRODUCER_MODEL, [device], PRODUCER_MEM_UTIL, stream)
            lent = int(LEND_FRACTION * mem)
            return _Placed(eng, [device], "producer", PRODUCER_MEM_UTIL, lent_bytes=lent, peer=device - 1)
        stream = WorkloadStream("poisson", self.rate, seed)
        eng = self._engine(f"sim:{device}", self.model, [device], CONSUMER_MEM_UTIL, stream)
        return _Placed(eng, [device], "none", CONSUMER_MEM_UTIL)

    def _rebuild_builtins(self) -> None:
        taken = {d for p in self._deployed.values() for d in p.devices}
        for dev in range(self.count):
            if dev in taken:
                self._builtin.pop(dev, None)
            elif dev not in self._builtin:
                self._builtin[dev] = self._build_builtin(dev)
        # A pair lends only while both halves run built-in engines; otherwise the consumer's
        # lent capacity drops to 0 (its offloaded KV moves to DRAM) and both report role "none".
        lent = int(LEND_FRACTION * self.gpu.memory_bytes)
        for dev in sorted(self._builtin):
            placed = self._builtin[dev]
            partner = dev + 1 if dev % 2 == 0 else dev - 1
            if placed.engine.config.preemption_mode != "offload_peer" and dev % 2 == 0:
                continue  # the odd device out: a plain engine
            paired = partner in self._builtin and partner < self.count
            if dev % 2 == 0:
                placed.role, placed.peer = ("consumer", partner) if paired else ("none", None)
                placed.engine.set_peer_capacity(lent if paired else 0)
            else:
                placed.role, placed.peer = ("producer", partner) if paired else ("none", None)
                placed.lent_bytes = lent if paired else 0

    # ---- Host ---------------------------------------------------------------------------------

    async def start(self, on_status: StatusCallback) -> None:
        self._on_status = on_status
        self._t0 = time.monotonic()
        self._rebuild_builtins()
        log.info("Simulated host: %d x %s, consumer model %s.", self.count, self.kind, self.model)

    def describe(self) -> list[DeviceInfo]:
        return [
            DeviceInfo(
                index=i,
                uuid=f"SIM-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{self.name}/{self.kind}/{i}')}",
                name=f"NVIDIA {self.kind} (simulated)",
                kind="gpu",
                memory_total_bytes=self.gpu.memory_bytes,
                nvlink_peers=[j for j in range(self.count) if j != i],
            )
            for i in range(self.count)
        ]

    def _placed(self) -> list[_Placed]:
        return [self._builtin[d] for d in sorted(self._builtin)] + [
            self._deployed[k] for k in sorted(self._deployed)
        ]

    def advance_to(self, seconds: float) -> None:
        """Advance every engine through each whole simulated second up to `seconds`."""
        self._sim_now = max(self._sim_now, seconds)
        for placed in self._placed():
            while placed.engine.t + 1.0 <= seconds:
                placed.engine.advance()

    def sample(self) -> tuple[list[DeviceSample], list[EngineSample]]:
        return self.sample_at(time.monotonic() - self._t0)

    def sample_at(self, seconds: float) -> tuple[list[DeviceSample], list[EngineSample]]:
        """Advance to `seconds` of simulated time and report the whole seconds simulated since the
        previous sample (each second in exactly one sample)."""
        self.advance_to(seconds)
        windows = {p.engine.engine_id: p.engine.take_window() for p in self._placed()}
        mem = self.gpu.memory_bytes
        tdp = TDP_W.get(self.kind, 700.0)
        by_device: dict[int, _Placed] = {d: p for p in self._placed() for d in p.devices}
        devices: list[DeviceSample] = []
        for i in range(self.count):
            placed = by_device.get(i)
            if placed is None:
                devices.append(DeviceSample(i, 0, mem, 0.0, 30.0, IDLE_W))
                continue
            util = 100.0 * windows[placed.engine.engine_id].busy_fraction
            used = min(mem, int(placed.mem_util * mem) + placed.lent_bytes)
            borrowed = 0
            if placed.role == "consumer":
                borrowed = placed.engine.peer_used_bytes
            devices.append(
                DeviceSample(
                    index=i,
                    memory_used_bytes=used,
                    memory_free_bytes=mem - used,
                    utilization_pct=round(util, 1),
                    temperature_c=round(32.0 + 0.4 * util, 1),
                    power_w=round(IDLE_W + (tdp - IDLE_W) * util / 100.0, 1),
                    aqua_role=placed.role,
                    lent_bytes=placed.lent_bytes,
                    borrowed_bytes=borrowed,
                    paired_with=placed.peer,
                )
            )
        engines = [p.engine.sample(windows[p.engine.engine_id]) for p in self._placed()]
        engines += [EngineSample(deployment_id=d, state="failed") for d in sorted(self._failed)]
        return devices, engines

    async def apply(self, deployments: list[DeploymentSpec]) -> None:
        if self._closed:  # as EngineManager: a stopping agent reports nothing running after "stopped"
            log.info("Agent stopping: ignoring a desired list of %d deployment(s).", len(deployments))
            return
        wanted = {d.id: d for d in deployments}
        for dep_id in [d for d, p in self._deployed.items() if wanted.get(d) != p.spec]:
            del self._deployed[dep_id]
            self._on_status(self._status(dep_id, "stopped"))
        for dep_id in sorted(d for d in self._failed if d not in wanted):  # as EngineManager: a
            del self._failed[dep_id]  # refused deployment that goes is stopped, not failed for ever
            self._on_status(self._status(dep_id, "stopped"))
        for dep_id in sorted(wanted):
            spec = wanted[dep_id]
            if dep_id in self._deployed:
                continue
            try:
                self._deployed[dep_id] = self._place(spec)
            except ValueError as exc:
                status = self._status(dep_id, "failed", error=str(exc))
                self._failed[dep_id] = status
                self._on_status(status)
                continue
            self._failed.pop(dep_id, None)
            self._on_status(self._status(dep_id, "running"))
        self._rebuild_builtins()

    def _place(self, spec: DeploymentSpec) -> _Placed:
        bad = [d for d in spec.devices if not 0 <= d < self.count]
        if bad:
            raise ValueError(f"device(s) {bad} do not exist on this host (devices: 0..{self.count - 1})")
        taken = {d for p in self._deployed.values() for d in p.devices} & set(spec.devices)
        if taken:
            raise ValueError(f"device(s) {sorted(taken)} already run another deployment")
        model = spec.model.name if spec.model.name in MODEL_CONFIGS else self.model
        raw = spec.model.engine_options.get("sim_rate", self.rate)
        if isinstance(raw, bool) or not isinstance(raw, int | float):  # strict, as the control plane
            raise ValueError(f"engine_options.sim_rate={raw!r:.200} must be a number of requests/s")
        rate = float(raw)
        if not 0 < rate <= MAX_SIM_RATE:  # as the control plane checks it (an older one did not)
            raise ValueError(f"engine_options.sim_rate={rate} must be positive and at most {MAX_SIM_RATE:g}")
        stream = WorkloadStream("poisson", rate, self.seed * 1000 + 500 + len(self._deployed))
        engine = self._engine(spec.id, model, sorted(spec.devices), CONSUMER_MEM_UTIL, stream)
        return _Placed(engine, sorted(spec.devices), "none", CONSUMER_MEM_UTIL, spec=spec)

    def _status(self, dep_id: str, state: DeploymentState, error: str | None = None) -> DeploymentStatus:
        return DeploymentStatus(dep_id, state, time.time(), error=error, simulated=True)

    async def restart(self, deployment_id: str) -> bool:
        placed = self._deployed.get(deployment_id)
        if placed is None or placed.spec is None:
            return False
        self._deployed[deployment_id] = self._place_fresh(placed.spec)
        self._on_status(self._status(deployment_id, "starting"))
        self._on_status(self._status(deployment_id, "running"))
        return True

    def _place_fresh(self, spec: DeploymentSpec) -> _Placed:
        del self._deployed[spec.id]
        return self._place(spec)

    def tail(self, deployment_id: str, lines: int) -> list[str] | None:
        placed = self._deployed.get(deployment_id)
        if placed is None:
            return None
        s = placed.engine.sample()
        return [
            f"simulated engine {deployment_id}: t={placed.engine.t:.0f}s running={s.running} "
            f"waiting={s.waiting} preemptions={s.preemptions_total}"
        ][-lines:]

    def statuses(self) -> list[DeploymentStatus]:
        out = [self._status(d, "running") for d in sorted(self._deployed)]
        return sorted(out + list(self._failed.values()), key=lambda s: s.deployment_id)

    async def stop(self) -> None:
        self._closed = True
        for dep_id in sorted([*self._deployed, *self._failed]):
            self._on_status(self._status(dep_id, "stopped"))
        self._deployed.clear()
        self._failed.clear()
        self._builtin.clear()
