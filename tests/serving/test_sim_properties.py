"""Properties over random engine configurations and workloads (hypothesis)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from serving.profiler.sim_probe import _PeakKVCache
from serving.sim.config import EngineConfig
from tests.serving.conftest import make_engine, make_requests

configs = st.builds(
    EngineConfig,
    max_num_batched_tokens=st.sampled_from([64, 256, 2048]),
    max_num_seqs=st.integers(1, 64),
    block_size=st.sampled_from([1, 4, 16]),
    num_kv_blocks=st.integers(50, 400),
    preemption_mode=st.sampled_from(["recompute", "offload_dram"]),
)


@settings(max_examples=25, deadline=None)
@given(config=configs, seed=st.integers(0, 10_000), rate=st.sampled_from([5.0, 40.0, 200.0]))
def test_every_request_finishes_and_fast_forward_changes_nothing(
    config: EngineConfig, seed: int, rate: float
) -> None:
    reqs = make_requests(60, rate=rate, prompt=(1, 300), output=(1, 120), seed=seed)
    fields = {f: getattr(config, f) for f in EngineConfig.__dataclass_fields__}
    fast = make_engine(**fields)
    slow = make_engine(**{**fields, "fast_forward": False})
    # KV accountants that see every change of the free-block count
    fast.kv = fast_kv = _PeakKVCache(config.num_kv_blocks, config.block_size)
    slow.kv = slow_kv = _PeakKVCache(config.num_kv_blocks, config.block_size)
    a, b = fast.run(reqs), slow.run(reqs)
    assert [r.token_times for r in a] == [r.token_times for r in b]
    assert fast_kv.min_free == slow_kv.min_free, "fast forward hid the peak KV use"
    assert fast.stats.preemptions == slow.stats.preemptions
    cap = config.num_kv_blocks * config.block_size
    for req, rec in zip(reqs, a, strict=True):
        if req.prompt_tokens + req.output_tokens - 1 > cap:
            assert rec.token_times == []
            continue
        assert rec.finished and all(x < y for x, y in itertools.pairwise(rec.token_times))
        if config.preemption_mode == "recompute":
            assert rec.bytes_moved == 0
        else:
            assert rec.recomputed_tokens == 0 and (rec.bytes_moved > 0) == (rec.preemptions > 0)
    assert fast.kv.free == fast.kv.total
