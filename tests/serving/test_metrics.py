"""Metrics on hand-built records; every expected figure is worked out by hand in the comments."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving.metrics import (
    SLO,
    SUMMARY_KEYS,
    RequestRecord,
    attainment,
    attains,
    e2e_latencies,
    goodput,
    percentile,
    summarize,
    tbts,
    tpots,
    ttfts,
)


def make_records() -> list[RequestRecord]:
    return [
        # (times are binary fractions so that boundary comparisons are exact)
        # A: TTFT 0.5, gaps 0.25 and 0.5, TPOT (1.25-0.5)/2 = 0.375, E2E 1.25, finished
        RequestRecord(0, 0.0, 10, 3, [0.5, 0.75, 1.25], preemptions=1, bytes_moved=100),
        # B: TTFT 0.25, gap 0.125, TPOT 0.125, E2E 0.375, finished, class "batch"
        RequestRecord(1, 1.0, 10, 2, [1.25, 1.375], bytes_moved=50, slo_class="batch"),
        # C: TTFT 1.0, one of four tokens: unfinished, no gap, no TPOT, no E2E
        RequestRecord(2, 2.0, 10, 4, [3.0], preemptions=2),
        # D: nothing emitted
        RequestRecord(3, 3.0, 10, 1, []),
    ]


def test_it_extracts_ttft_tbt_tpot_e2e() -> None:
    recs = make_records()
    assert ttfts(recs) == [0.5, 0.25, 1.0]
    assert tbts(recs) == [0.25, 0.5, 0.125]
    assert tpots(recs) == [0.375, 0.125]
    assert e2e_latencies(recs) == [1.25, 0.375]


def test_it_interpolates_percentiles_linearly() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="q="):
        percentile([1.0], 101)


def test_it_requires_finishing_and_both_targets() -> None:
    a, b, c, d = make_records()
    tpot_slo = SLO(ttft_s=0.6, tbt_s=0.25)  # A's TPOT 0.375 misses; B meets both
    assert not attains(a, tpot_slo)
    assert attains(b, tpot_slo)
    assert not attains(c, SLO(ttft_s=10, tbt_s=10))  # unfinished never attains
    assert not attains(d, SLO(ttft_s=10, tbt_s=10))
    assert not attains(b, SLO(ttft_s=0.2, tbt_s=10))  # TTFT 0.25 misses
    assert attainment(make_records(), tpot_slo) == pytest.approx(1 / 4)


def test_it_measures_pacing_by_kind() -> None:
    a = make_records()[0]  # gaps 0.25, 0.5: max 0.5, p99 = 0.25 + 0.99 * 0.25 = 0.4975, TPOT 0.375
    assert attains(a, SLO(1.0, 0.5, "max_tbt"))  # equal to target attains
    assert not attains(a, SLO(1.0, 0.49, "max_tbt"))
    assert attains(a, SLO(1.0, 0.498, "p99_tbt"))
    assert not attains(a, SLO(1.0, 0.497, "p99_tbt"))
    assert attains(a, SLO(1.0, 0.375, "tpot"))
    assert not attains(a, SLO(1.0, 0.37, "tpot"))
    single = RequestRecord(9, 0.0, 5, 1, [0.1])
    assert attains(single, SLO(0.1, 1e-9, "max_tbt"))  # no gaps: any pacing target is met


def test_it_applies_per_class_slos_with_a_default() -> None:
    recs = make_records()
    loose = SLO(ttft_s=0.6, tbt_s=0.5)  # A and B both meet it
    strict = SLO(ttft_s=0.2, tbt_s=0.5)  # B's TTFT 0.25 misses
    assert attainment(recs, {None: loose}) == pytest.approx(2 / 4)
    assert attainment(recs, {None: loose, "batch": strict}) == pytest.approx(1 / 4)
    with pytest.raises(ValueError, match="no SLO for class"):
        attainment(recs, {"batch": loose})
    assert math.isnan(attainment([], loose))


def test_it_rejects_bad_slos() -> None:
    with pytest.raises(ValueError, match="ttft_s"):
        SLO(0.0, 1.0)
    with pytest.raises(ValueError, match="tbt_s"):
        SLO(1.0, -1.0)
    with pytest.raises(ValueError, match="tbt_kind"):
        SLO(1.0, 1.0, "mean_tbt")  # type: ignore[arg-type]


def test_it_summarizes_a_run() -> None:
    recs = make_records()
    s = summarize(recs, duration_s=10.0, slo=SLO(ttft_s=0.6, tbt_s=0.5))
    assert tuple(s) == SUMMARY_KEYS
    assert s["ttft_p50"] == pytest.approx(0.5)  # median of 0.25, 0.5, 1.0
    assert s["ttft_p90"] == pytest.approx(0.9)  # 0.5 + 0.8 * (1.0 - 0.5)
    assert s["ttft_mean"] == pytest.approx(1.75 / 3)
    assert s["tbt_p50"] == pytest.approx(0.25)  # median of 0.125, 0.25, 0.5
    assert s["tpot_p50"] == pytest.approx(0.25)  # mean of 0.125, 0.375
    assert s["e2e_p50"] == pytest.approx(0.8125)  # mean of 0.375, 1.25
    assert s["throughput_tokens_per_s"] == pytest.approx((3 + 2 + 1) / 10.0)
    assert (s["requests"], s["finished"], s["preemptions"], s["bytes_moved"]) == (4, 2, 3, 150)
    assert s["attainment"] == pytest.approx(0.5)
    assert math.isnan(summarize(recs, 10.0)["attainment"])
    for bad in (math.inf, 0.0, -1.0, math.nan):  # inf was accepted and reported 0 tokens/s
        with pytest.raises(ValueError, match=r"duration_s=\S+ must be positive and finite"):
            summarize(recs, bad)


def test_it_reports_nan_latencies_for_an_empty_run() -> None:
    s = summarize([], duration_s=1.0)
    assert math.isnan(s["ttft_p99"]) and s["requests"] == 0 and s["throughput_tokens_per_s"] == 0


class Probe:
    """A step attainment curve that records the rates it was asked about."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.calls: list[float] = []

    def __call__(self, rate: float) -> float:
        self.calls.append(rate)
        return 0.95 if rate <= self.threshold else 0.5


@pytest.mark.parametrize(("threshold", "lo", "hi"), [(7.3, 1.0, 4.0), (7.3, 1.0, 100.0), (0.3, 1.0, 2.0)])
def test_it_finds_the_goodput_threshold(threshold: float, lo: float, hi: float) -> None:
    probe = Probe(threshold)
    g = goodput(probe, target=0.9, lo=lo, hi=hi, rel_tol=0.01)
    assert threshold * 0.99 <= g <= threshold
    assert len(probe.calls) == len(set(probe.calls))  # no rate simulated twice


def test_it_bounds_goodput_expansion() -> None:
    assert goodput(lambda r: 1.0, target=0.9, lo=1.0, hi=2.0, max_expansions=3) == 16.0
    assert goodput(lambda r: 0.0, target=0.9, lo=1.0, hi=2.0, max_expansions=3) == 0.0
    assert goodput(lambda r: math.nan, target=0.9, lo=1.0, hi=2.0, max_expansions=2) == 0.0


def test_it_follows_a_smooth_attainment_curve() -> None:
    # attainment 1 - rate / 100 meets 0.9 up to rate 10
    g = goodput(lambda r: 1 - r / 100, target=0.9, lo=1.0, hi=50.0, rel_tol=0.001)
    assert g == pytest.approx(10.0, rel=0.002) and g <= 10.0 + 1e-9


def test_it_rejects_bad_goodput_bounds() -> None:
    with pytest.raises(ValueError, match="lo"):
        goodput(lambda r: 1.0, lo=5.0, hi=1.0)
    with pytest.raises(ValueError, match="target"):
        goodput(lambda r: 1.0, target=1.5, lo=1.0, hi=2.0)


# --- properties over arbitrary records -------------------------------------------------------------


@st.composite
def records(draw: st.DrawFn) -> list[RequestRecord]:
    out = []
    for i in range(draw(st.integers(0, 8))):
        arrival = draw(st.floats(0, 100))
        gaps = draw(st.lists(st.floats(0, 5), max_size=6))
        first = arrival + draw(st.floats(0, 5))
        times = [first + sum(gaps[:k]) for k in range(len(gaps) + 1)] if draw(st.booleans()) else []
        out.append(RequestRecord(i, arrival, 1, draw(st.integers(1, 8)), times))
    return out


@given(records(), st.floats(0.01, 10), st.floats(0.01, 10), st.sampled_from(["tpot", "p99_tbt", "max_tbt"]))
def test_it_only_credits_finished_requests(
    recs: list[RequestRecord], ttft: float, tbt: float, kind: str
) -> None:
    slo = SLO(ttft, tbt, kind)  # type: ignore[arg-type]
    for r in recs:
        if attains(r, slo):
            assert r.finished and r.ttft is not None and r.ttft <= ttft
    a = attainment(recs, slo)
    assert (math.isnan(a) and not recs) or 0.0 <= a <= sum(r.finished for r in recs) / len(recs)
    # a looser SLO never lowers attainment
    if recs:
        assert attainment(recs, SLO(ttft * 2, tbt * 2, kind)) >= a  # type: ignore[arg-type]


@given(records())
def test_it_orders_summary_percentiles(recs: list[RequestRecord]) -> None:
    s = summarize(recs, duration_s=1.0)
    for lo, hi in (("ttft_p50", "ttft_p90"), ("ttft_p90", "ttft_p99"), ("tbt_p50", "tbt_p99")):
        assert math.isnan(s[lo]) == math.isnan(s[hi])
        assert math.isnan(s[lo]) or s[lo] <= s[hi] + 1e-12
    assert s["finished"] <= s["requests"] == len(recs)


@given(
    lo=st.floats(0.01, 10),
    span=st.floats(1.01, 100),
    position=st.floats(0.001, 1),
    rel_tol=st.sampled_from([0.001, 0.01, 0.1]),
)
def test_goodput_finds_a_monotone_thresholds_rate_within_tolerance(
    lo: float, span: float, position: float, rel_tol: float
) -> None:
    # Attainment falls below the target past `threshold`, anywhere from lo / 1000 up to hi.
    hi = lo * span
    threshold = lo / 1000 + position * (hi - lo / 1000)
    probe = Probe(threshold)
    g = goodput(probe, target=0.9, lo=lo, hi=hi, rel_tol=rel_tol)
    assert threshold / (1 + rel_tol) <= g <= threshold  # measured to meet, and within tolerance
    assert g in probe.calls and len(probe.calls) == len(set(probe.calls))


@given(seed=st.integers(0, 2**32), target=st.sampled_from([0.5, 0.9, 0.99]))
def test_goodput_returns_a_rate_measured_to_meet_even_when_attainment_is_not_monotone(
    seed: int, target: float
) -> None:
    seen: dict[float, float] = {}

    def noisy(rate: float) -> float:
        seen[rate] = random.Random(f"{seed}/{rate!r}").random()
        return seen[rate]

    g = goodput(noisy, target=target, lo=1.0, hi=8.0, rel_tol=0.01)
    assert g == 0.0 or seen[g] >= target
