"""Helpers shared by the vLLM tests and the benchmark: engine configs, prompts, runs, counters."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from serving.aqua.offload.stats import read_json
from serving.vllm_ext.cpu_binding import reserved_cpus_env

REPO = Path(__file__).resolve().parents[2]
BYTES_PER_TOKEN = 2 * 2 * 2 * 64 * 4  # layers x (K, V) x kv heads x head_dim x fp32
BLOCK_SIZE = 32
AQUA_SCHEDULER = "serving.vllm_ext.scheduler.AquaScheduler"
# What every engine (and bare scheduler) of the tests and benchmarks shares: no prefix caching (it
# would hide recomputation), synchronous scheduling (one step's output before the next step's
# decisions), no torch.compile warm-up.
COMMON_ENGINE_ARGS: dict[str, Any] = {
    "block_size": BLOCK_SIZE,
    "enable_prefix_caching": False,
    "async_scheduling": False,
    "enforce_eager": True,
}

_TEXT = (
    "the quick brown fox jumps over lazy dog memory lending lets one GPU borrow idle memory from a "
    "neighbour and give it back when a request is preempted its cache is copied out in one transfer "
    "fair scheduler counts the service every request has received and serves the least served first"
)
WORDS = _TEXT.split(" ")


def engine_environ() -> dict[str, str]:
    """This process's environment plus what vLLM's spawned engine processes need: `serving` on
    PYTHONPATH, WARNING-level engine logs unless set, and vLLM's no-connector OpenMP core
    reservation for every engine, with or without the Aqua connector (one core for the
    engine-core process; see serving/vllm_ext/cpu_binding.py), so that both run the same thread
    binding. Engines without a connector get this reservation from vLLM anyway."""
    env = dict(os.environ)
    paths = env.get("PYTHONPATH", "")
    if str(REPO) not in paths.split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), paths) if p)
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.update(reserved_cpus_env(1, env))
    return env


@contextmanager
def engine_env() -> Iterator[None]:
    """`engine_environ()` in os.environ while engines start, restored afterwards.

    vLLM spawns its engine-core process (which spawns the worker) while the engine is built, with
    this process's environment; afterwards nothing reads these settings, so they need not outlive
    the start (before, they stayed set for the rest of the test session and changed the log level
    of engines other tests started)."""
    saved = dict(os.environ)
    os.environ.update(engine_environ())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def make_prompts(n: int, seed: int = 0, min_words: int = 6, max_words: int = 90) -> list[str]:
    """`n` deterministic prompts of varied lengths (some longer than one prefill chunk)."""
    import random

    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = rng.randint(min_words, max_words)
        out.append(f"Request {i}: " + " ".join(rng.choice(WORDS) for _ in range(k)))
    return out


def aqua_kv_transfer(**extra: Any) -> dict[str, Any]:
    return {
        "kv_connector": "AquaConnector",
        "kv_connector_module_path": "serving.vllm_ext.connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def make_llm(
    model: Path,
    kv_tokens: int,
    *,
    scheduler: str | None = AQUA_SCHEDULER,
    additional: dict[str, Any] | None = None,
    connector: dict[str, Any] | None = None,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 128,
    max_model_len: int = 256,
    dtype: str = "float32",
) -> Any:
    """A vLLM engine for the tiny model with a KV cache of `kv_tokens` tokens."""
    from vllm import LLM

    kwargs: dict[str, Any] = {}
    if scheduler:
        kwargs["scheduler_cls"] = scheduler
    if additional:
        kwargs["additional_config"] = additional
    if connector is not None:
        kwargs["kv_transfer_config"] = connector
    with engine_env():
        return LLM(
            model=str(model),
            dtype=cast(Any, dtype),
            kv_cache_memory_bytes=kv_tokens * BYTES_PER_TOKEN // (1 if dtype == "float32" else 2),
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            seed=0,
            **COMMON_ENGINE_ARGS,
            **kwargs,
        )


@dataclass(frozen=True)
class Completion:
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]


def generate(llm: Any, prompts: list[str], max_tokens: int = 40) -> list[Completion]:
    """Greedy completions with the chosen token's logprob at every position."""
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=0, ignore_eos=True, seed=0)
    outs = llm.generate(prompts, sp, use_tqdm=False)
    result = []
    for o in outs:
        c = o.outputs[0]
        lps = tuple(float(d[t].logprob) for t, d in zip(c.token_ids, c.logprobs or [], strict=True))
        result.append(Completion(tuple(c.token_ids), lps))
    return result


def max_logprob_diff(a: list[Completion], b: list[Completion]) -> float:
    """Largest |logprob| difference where tokens agree; inf if any token differs."""
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if x.token_ids != y.token_ids:
            return float("inf")
        worst = max([worst, *(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True))])
    return worst


def counters(stats_dir: Path, name: str, settle_s: float = 0.3) -> dict[str, Any]:
    """The engine's counters file; by default once it has settled (the engine writes it off its step
    thread, a moment after a run ends). settle_s=0 reads it as it is now (to watch a run)."""
    return read_json(stats_dir / name, settle_s=settle_s)


def delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, int]:
    return {k: int(v) - int(before.get(k, 0)) for k, v in after.items() if isinstance(v, int | float)}


def shutdown(llm: Any) -> None:
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception as exc:  # already gone
        print(f"engine shutdown: {exc}", file=sys.stderr)
