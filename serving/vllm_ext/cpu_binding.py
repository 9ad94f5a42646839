"""OpenMP core reservation for vLLM's CPU build when the Aqua connector is loaded.

vLLM 0.32's CPU executor binds each worker's OpenMP threads to cores and reserves some cores for
the engine-core process, which busy-polls the worker's reply queue (`sched_yield`) while a step
runs. Without a KV connector it reserves `local_world_size` cores; with *any* `kv_transfer_config`
it reserves one more per rank "for nixl_connector under p/d case"
(vllm/utils/ompmultiprocessing.py, `OMPProcessManager.__init__`). When the machine has no core to
spare (2 cores, one worker: 2 reserved >= 2 selected) vLLM warns, reserves nothing, and the
worker's OpenMP team then spans the core where the engine core spins: every parallel region waits
for a thread that shares its core with a busy-polling process.

Measured on the 2-core development machine (tiny Llama, 8 requests x 320 tokens + a burst of 16,
`benchmarks/aqua_burst.py` workload, vLLM's default scheduler both times): TBT p50 72-79 ms and
95-109 tok/s with the connector configured vs 8-11 ms and 614-708 tok/s without it; the worker
process used 15-17 CPU-s instead of 3-3.5 for the same 2,688 tokens. With the reservation set
back to vLLM's no-connector value the two configurations ran within noise of each other.

The Aqua connector starts no transfer thread (its copies run inline in the worker's connector
hooks), so the extra core buys it nothing. Engines that load it on a CPU host should get vLLM's
no-connector reservation through `VLLM_CPU_NUM_OF_RESERVED_CPU`; an explicit value set by the
operator is kept.
"""

from __future__ import annotations

from collections.abc import Mapping

RESERVED_CPUS_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"


def reserved_cpus_env(local_world_size: int = 1, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment entries that give a CPU engine with the Aqua connector vLLM's no-connector
    core reservation (one core per local worker on x86/Arm), unless `environ` already sets one.

    Args:
        local_world_size: Workers of this engine on the host (tensor x pipeline parallel).
        environ: The environment the engine will inherit (empty when None).

    Returns:
        `{RESERVED_CPUS_ENV: str(local_world_size)}`, or `{}` when `environ` has a value.
    """
    if local_world_size <= 0:
        raise ValueError(f"{local_world_size=} must be positive")
    if environ is not None and environ.get(RESERVED_CPUS_ENV):
        return {}
    return {RESERVED_CPUS_ENV: str(local_world_size)}
