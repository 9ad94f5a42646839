"""Model configs, least-squares fitting, derived presets and KV transfer costs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.costmodel import (
    HOST_MEMCPY,
    LLAMA_2_13B,
    LLAMA_3_8B,
    NVLINK4,
    PCIE5_X16,
    CostModel,
    PhaseCoeffs,
    available_presets,
    fit_cost_model,
    get_gpu,
    get_model_config,
    get_preset,
    kv_capacity_tokens,
    kv_transfer_seconds,
)

TRUE = CostModel(PhaseCoeffs(0.012, 6.5e-5, 2.2e-9), PhaseCoeffs(0.008, 4.0e-8, 3.0e-5), 131072, "true")


def synthetic_samples(
    model: CostModel, noise: float, seed: int
) -> tuple[list[tuple[list[int], float]], list[tuple[list[int], float]]]:
    """Profiling-like samples with multiplicative Gaussian timing noise of relative size `noise`.

    Like a profiler's grid, the number of sequences and their typical length are drawn
    independently (length log-uniform in [16, 8192]), so the regressors are not collinear.
    """
    rng = np.random.default_rng(seed)
    prefill, decode = [], []
    for _ in range(400):
        scale = float(np.exp(rng.uniform(np.log(16), np.log(8192))))
        chunks = np.maximum(1, rng.uniform(0.5, 1.0, size=rng.integers(1, 5)) * scale).astype(int).tolist()
        prefill.append((chunks, model.prefill_time(chunks) * (1 + noise * rng.standard_normal())))
        scale = float(np.exp(rng.uniform(np.log(16), np.log(8192))))
        ctxs = np.maximum(1, rng.uniform(0.5, 1.0, size=rng.integers(1, 257)) * scale).astype(int).tolist()
        decode.append((ctxs, model.decode_time(ctxs) * (1 + noise * rng.standard_normal())))
    return prefill, decode


def assert_close(got: PhaseCoeffs, want: PhaseCoeffs, rel: float) -> None:
    for g, w in ((got.a, want.a), (got.b, want.b), (got.c, want.c)):
        assert g == pytest.approx(w, rel=rel)


@pytest.mark.parametrize("noise", [0.0, 0.002])
def test_it_recovers_known_coefficients_within_one_percent(noise: float) -> None:
    prefill, decode = synthetic_samples(TRUE, noise, seed=11)
    fitted = fit_cost_model(prefill, decode, kv_bytes_per_token=131072, name="fit")
    assert_close(fitted.prefill, TRUE.prefill, rel=0.01 if noise else 1e-6)
    assert_close(fitted.decode, TRUE.decode, rel=0.01 if noise else 1e-6)
    assert fitted.kv_bytes_per_token == 131072 and fitted.name == "fit"


def test_it_weights_samples_by_relative_error() -> None:
    # With 2% timing noise on samples from ~10 ms to ~1 s, an unweighted fit lets the longest
    # prefills decide the intercept (off by 1.3% at this seed, ~2% typically); fitting relative
    # error keeps the fixed cost of short iterations within 1%.
    prefill, decode = synthetic_samples(TRUE, 0.02, seed=0)
    fitted = fit_cost_model(prefill, decode, kv_bytes_per_token=1)
    assert fitted.prefill.a == pytest.approx(TRUE.prefill.a, rel=0.01)
    assert fitted.decode.a == pytest.approx(TRUE.decode.a, rel=0.01)


def _relative_error(samples: list[tuple[list[int], float]], time: Callable[[list[int]], float]) -> float:
    return float(np.linalg.norm([(time(comp) - sec) / sec for comp, sec in samples]))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(3, 30), noise=st.sampled_from([0.02, 0.05, 0.2]))
def test_a_fit_has_no_negative_coefficient_and_fits_at_least_as_well_as_the_truth(
    seed: int, n: int, noise: float
) -> None:
    # Unconstrained least squares gave a negative coefficient to 174 of 200 fits of 12 noisy
    # samples per phase, one a decode step of -0.157 s for 256 contexts of 8000 tokens.
    prefill, decode = synthetic_samples(TRUE, noise, seed=seed)
    prefill, decode = prefill[:n], decode[:n]
    fitted = fit_cost_model(prefill, decode, kv_bytes_per_token=1)
    for coeffs in (fitted.prefill, fitted.decode):
        assert min(coeffs.a, coeffs.b, coeffs.c) >= 0
    assert fitted.decode_time([8000] * 256) >= fitted.decode_time([8000]) >= 0
    assert fitted.prefill_time([32768]) >= fitted.prefill_time([16]) >= 0
    # The true coefficients are non-negative too, so the constrained optimum fits no worse.
    assert _relative_error(prefill, fitted.prefill_time) <= _relative_error(prefill, TRUE.prefill_time) * (
        1 + 1e-9
    )
    assert _relative_error(decode, fitted.decode_time) <= _relative_error(decode, TRUE.decode_time) * (
        1 + 1e-9
    )


def test_it_refuses_samples_that_cannot_determine_the_coefficients() -> None:
    prefill, decode = synthetic_samples(TRUE, 0.0, seed=1)
    with pytest.raises(ValueError, match="at least 3"):
        fit_cost_model(prefill[:2], decode, 1)
    # batch size always 1: the intercept and the per-sequence term are indistinguishable
    single = [([c], TRUE.decode_time([c])) for c in (100, 200, 400, 800)]
    with pytest.raises(ValueError, match="rank"):
        fit_cost_model(prefill, single, 1)
    with pytest.raises(ValueError, match="empty batch"):
        fit_cost_model([*prefill, ([], 0.1)], decode, 1)
    with pytest.raises(ValueError, match="positive"):
        fit_cost_model([(c, -s) for c, s in prefill], decode, 1)


def test_it_computes_kv_bytes_per_token_from_the_config() -> None:
    assert LLAMA_3_8B.kv_bytes_per_token() == 32 * 8 * 128 * 2 * 2 == 131072
    assert LLAMA_2_13B.kv_bytes_per_token() == 40 * 40 * 128 * 2 * 2 == 819200
    assert get_model_config("llama-3-70b").kv_bytes_per_token() == 80 * 8 * 128 * 2 * 2
    with pytest.raises(ValueError, match="llama-2-13b, llama-3-70b, llama-3-8b"):
        get_model_config("gpt-2")


def test_it_offers_presets_for_both_models_on_three_gpus() -> None:
    assert set(available_presets()) >= {
        (m, g) for m in ("llama-3-8b", "llama-2-13b") for g in ("h100", "h200", "a100")
    }
    for model, gpu in available_presets():
        cm = get_preset(model, gpu)
        assert cm.name == f"{model}@{gpu}"
        assert cm.kv_bytes_per_token == get_model_config(model).kv_bytes_per_token()
        for phase in (cm.prefill, cm.decode):
            assert phase.a > 0 and phase.b > 0 and phase.c > 0
    with pytest.raises(ValueError, match="a100, h100, h200"):
        get_preset("llama-3-8b", "v100")
    with pytest.raises(ValueError, match="choose one of"):
        get_preset("mistral", "h100")


def test_it_derives_presets_that_order_gpus_by_their_datasheets() -> None:
    h100, h200, a100 = (get_preset("llama-3-8b", g) for g in ("h100", "h200", "a100"))
    batch = [1024] * 32
    # decode is bandwidth-bound: H200 (4.8 TB/s) < H100 (3.35) < A100 (2.0)
    assert h200.decode_time(batch) < h100.decode_time(batch) < a100.decode_time(batch)
    # prefill per token is compute-bound: H100 and H200 share 989 TFLOPS; A100 has 312
    assert h100.prefill.b == pytest.approx(h200.prefill.b)
    assert a100.prefill.b / h100.prefill.b == pytest.approx(989 / 312)
    # the fixed cost streams the weights once: 16.06 GB / (0.8 * 3.35 TB/s) + 1 ms
    assert h100.decode.a == pytest.approx(LLAMA_3_8B.weight_bytes() / (0.8 * 3.35e12) + 1e-3)
    # per context token: one read of its 131072 KV bytes
    assert h100.decode.b == pytest.approx(131072 / (0.8 * 3.35e12))


def test_it_derives_presets_in_line_with_published_latencies() -> None:
    # llama-3-8b on H100 decodes a single sequence at roughly 100-200 tokens/s
    assert 5e-3 < get_preset("llama-3-8b", "h100").decode_time([512]) < 10e-3
    # DistServe (OSDI'24, Table 1) sets 0.25 s TTFT / 0.1 s TPOT SLOs for its 13B chatbot on A100s;
    # an unloaded 13B A100 must sit well inside both.
    a100_13b = get_preset("llama-2-13b", "a100")
    assert a100_13b.prefill_time([512]) < 0.25
    assert a100_13b.decode_time([1024]) < 0.1 / 3


def test_it_splits_work_over_tensor_parallel_gpus() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        get_preset("llama-3-70b", "h100")
    tp4 = get_preset("llama-3-70b", "h100", tp=4)
    assert tp4.name == "llama-3-70b@h100x4"
    tp8 = get_preset("llama-3-70b", "h100", tp=8)
    assert tp8.decode_time([1024] * 8) < tp4.decode_time([1024] * 8)


def test_it_prices_kv_transfers_by_link() -> None:
    n = 1000
    nbytes = n * 131072
    assert kv_transfer_seconds(n, LLAMA_3_8B, NVLINK4) == pytest.approx(5e-6 + nbytes / 450e9)
    assert kv_transfer_seconds(n, get_preset("llama-3-8b", "h100"), NVLINK4) == kv_transfer_seconds(
        n, LLAMA_3_8B, NVLINK4
    )
    assert (
        kv_transfer_seconds(n, LLAMA_3_8B, NVLINK4)
        < kv_transfer_seconds(n, LLAMA_3_8B, PCIE5_X16)
        < kv_transfer_seconds(n, LLAMA_3_8B, HOST_MEMCPY)
    )
    assert kv_transfer_seconds(0, LLAMA_3_8B, PCIE5_X16) == 0.0
    with pytest.raises(ValueError, match="num_tokens"):
        kv_transfer_seconds(-1, LLAMA_3_8B, NVLINK4)


def test_it_sizes_the_kv_cache_beside_the_weights() -> None:
    h100 = get_gpu("h100")
    want = int((h100.memory_bytes * 0.9 - LLAMA_3_8B.weight_bytes()) // 131072)
    assert kv_capacity_tokens("llama-3-8b", "h100") == want
    assert kv_capacity_tokens("llama-3-8b", "h200") > want
    assert kv_capacity_tokens("llama-3-70b", "h100") == 0


@pytest.mark.parametrize(("model", "tp"), [("llama-3-8b", 3), ("llama-2-13b", 16), ("llama-3-70b", 48)])
def test_it_refuses_a_tensor_parallel_degree_that_does_not_divide_the_heads(model: str, tp: int) -> None:
    # vLLM refuses these; tp=3 on llama-3-8b (32 heads) used to be priced as 3 equal shards.
    with pytest.raises(ValueError, match="does not divide"):
        get_preset(model, "h100", tp)
    with pytest.raises(ValueError, match="does not divide"):
        kv_capacity_tokens(model, "h100", tp)


def test_kv_heads_are_replicated_not_split_beyond_their_count() -> None:
    # Llama-3-8B has 8 KV heads: on 16 GPUs each holds a copy of one, so a token takes twice the
    # model's 131,072 KV bytes across the group, and each GPU reads all of its head's KV per step
    # (measured before: 9,273,064 tokens at tp=16, as if each GPU held half a head).
    h100 = get_gpu("h100")
    free16 = h100.memory_bytes * 16 * 0.9 - LLAMA_3_8B.weight_bytes()
    assert kv_capacity_tokens("llama-3-8b", "h100", 16) == int(free16 // (2 * 131072))
    tp8, tp16 = get_preset("llama-3-8b", "h100", 8), get_preset("llama-3-8b", "h100", 16)
    assert tp16.decode.b == pytest.approx(tp8.decode.b)  # KV read per GPU per context token: one head
    assert get_preset("llama-2-13b", "h100", 8).decode.b == pytest.approx(
        get_preset("llama-2-13b", "h100", 1).decode.b / 8
    )  # 40 KV heads: 5 per GPU


def test_pipeline_stages_add_their_memory_to_the_kv_cache() -> None:
    h100 = get_gpu("h100")
    free = h100.memory_bytes * 2 * 4 * 0.9 - LLAMA_3_8B.weight_bytes()
    # 8 GPUs as 2-way TP x 4 stages hold as many KV tokens as 8-way TP (neither replicates a KV head)
    assert kv_capacity_tokens("llama-3-8b", "h100", 2, pp=4) == int(free // 131072)
    assert kv_capacity_tokens("llama-3-8b", "h100", 2, pp=4) == kv_capacity_tokens("llama-3-8b", "h100", 8)


PRESETS = [
    (m, g, tp)
    for m, g in [("llama-3-8b", "h100"), ("llama-2-13b", "a100"), ("llama-3-70b", "h200")]
    for tp in (1, 2, 4, 8)
]


@settings(max_examples=100, deadline=None)
@given(
    preset=st.sampled_from([p for p in PRESETS if p[0] != "llama-3-70b" or p[2] >= 2]),
    chunks=st.lists(st.integers(1, 8192), min_size=1, max_size=8),
    contexts=st.lists(st.integers(1, 8192), min_size=1, max_size=64),
    extra=st.integers(1, 4096),
)
def test_presets_cost_more_for_more_work_and_less_on_more_gpus(
    preset: tuple[str, str, int], chunks: list[int], contexts: list[int], extra: int
) -> None:
    model, gpu, tp = preset
    cost = get_preset(model, gpu, tp)
    # positive, and growing with every token, chunk, context and sequence added
    assert 0 < cost.prefill_time(chunks) < cost.prefill_time([*chunks[:-1], chunks[-1] + extra])
    assert cost.prefill_time(chunks) < cost.prefill_time([*chunks, extra])
    assert 0 < cost.decode_time(contexts) < cost.decode_time([*contexts[:-1], contexts[-1] + extra])
    assert cost.decode_time(contexts) < cost.decode_time([*contexts, extra])
    mixed = cost.iteration_time(chunks, contexts)
    assert max(cost.prefill_time(chunks), cost.decode_time(contexts)) < mixed
    # twice the GPUs never slows an iteration down
    if tp < 8:
        wider = get_preset(model, gpu, 2 * tp)
        assert wider.prefill_time(chunks) < cost.prefill_time(chunks)
        assert wider.decode_time(contexts) < cost.decode_time(contexts)
