"""Workload generators, length distributions and trace replay."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.workload import (
    LengthDistribution,
    LogNormalLength,
    Request,
    available_length_dists,
    gamma_arrivals,
    get_length_dist,
    load_trace,
    make_workload,
    on_off_arrivals,
    poisson_arrivals,
    register_length_dist,
    write_trace,
)
from serving.workload.arrivals import burst_windows

DATA = Path(__file__).resolve().parent.parent / "data"
KINDS = ("poisson", "gamma", "burst")


def gaps(times: np.ndarray) -> np.ndarray:
    return np.diff(times)


@pytest.mark.parametrize("kind", KINDS)
def test_it_is_deterministic_per_seed_and_differs_across_seeds(kind: str) -> None:
    a = make_workload(kind, 5.0, 200.0, seed=3)
    b = make_workload(kind, 5.0, 200.0, seed=3)
    c = make_workload(kind, 5.0, 200.0, seed=4)
    assert a == b
    assert a != c
    assert [r.req_id for r in a] == list(range(len(a)))
    arrivals = [r.arrival for r in a]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 0 and arrivals[-1] < 200.0


def test_it_keeps_lengths_independent_of_the_arrival_process() -> None:
    p = make_workload("poisson", 5.0, 100.0, seed=7)
    g = make_workload("gamma", 5.0, 100.0, seed=7)
    n = min(len(p), len(g))
    assert [(r.prompt_tokens, r.output_tokens) for r in p[:n]] == [
        (r.prompt_tokens, r.output_tokens) for r in g[:n]
    ]


def test_it_draws_poisson_gaps_with_mean_one_over_rate() -> None:
    t = poisson_arrivals(10.0, 5000.0, np.random.default_rng(0))
    g = gaps(t)
    assert len(t) == pytest.approx(50_000, rel=0.02)
    assert g.mean() == pytest.approx(0.1, rel=0.02)
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.03)  # exponential: CV 1


def test_it_makes_gamma_burstier_below_shape_one_and_keeps_the_mean() -> None:
    rng = np.random.default_rng(1)
    poisson_cv = (lambda g: g.std() / g.mean())(gaps(poisson_arrivals(10.0, 5000.0, rng)))
    bursty = gaps(gamma_arrivals(10.0, 5000.0, 0.25, rng))
    regular = gaps(gamma_arrivals(10.0, 5000.0, 4.0, rng))
    assert bursty.mean() == pytest.approx(0.1, rel=0.04)
    assert regular.mean() == pytest.approx(0.1, rel=0.02)
    bursty_cv = bursty.std() / bursty.mean()
    assert bursty_cv == pytest.approx(2.0, rel=0.08)  # 1 / sqrt(0.25)
    assert bursty_cv > 1.5 * poisson_cv
    assert regular.std() / regular.mean() == pytest.approx(0.5, rel=0.05)


def test_it_carries_k_times_the_rate_inside_burst_windows() -> None:
    rate, k, d, period, duration = 20.0, 4.0, 10.0, 60.0, 1200.0
    t = on_off_arrivals(rate, duration, np.random.default_rng(2), k, d, period, burst_start_s=20.0)
    windows = burst_windows(duration, d, period, 20.0)
    assert windows[:2] == [(20.0, 30.0), (80.0, 90.0)] and len(windows) == 20
    inside = np.zeros(len(t), dtype=bool)
    for s, e in windows:
        inside |= (t >= s) & (t < e)
    burst_time = sum(e - s for s, e in windows)
    rate_in = inside.sum() / burst_time
    rate_out = (~inside).sum() / (duration - burst_time)
    assert rate_out == pytest.approx(rate, rel=0.04)
    assert rate_in / rate_out == pytest.approx(k, rel=0.05)


class CountingRng:
    """A numpy Generator that counts the variates drawn through it."""

    def __init__(self, seed: int) -> None:
        self.rng, self.calls, self.draws = np.random.default_rng(seed), 0, 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.rng, name)

        def counted(*args: Any, size: int = 1, **kw: Any) -> Any:
            self.calls, self.draws = self.calls + 1, self.draws + size
            return method(*args, size=size, **kw)

        return counted


def test_burst_arrivals_cost_follows_the_requests_not_the_periods() -> None:
    # Each period's quiet and burst segments were drawn apart, at least 16 variates each: 20,000
    # periods holding ~50 arrivals drew 640,000 (and a 1 ms period over a day hung).
    rng = CountingRng(5)
    t = on_off_arrivals(0.002, 10_000.0, rng, 4.0, 0.5, 1.0)  # type: ignore[arg-type]
    assert 20 < len(t) < 100  # 0.002 x (0.5 + 4 x 0.5) x 10,000 = 50 expected
    assert rng.calls <= 2 and rng.draws <= 2 * len(t) + 32
    assert np.all(np.diff(t) >= 0) and t[0] >= 0 and t[-1] < 10_000.0
    # within each 1 s period only [0.25, 0.75) bursts: it holds 4 / 5 of the arrivals on average
    rng2 = np.random.default_rng(6)
    many = on_off_arrivals(2.0, 2000.0, rng2, 4.0, 0.5, 1.0)
    phase = many % 1.0
    assert ((phase >= 0.25) & (phase < 0.75)).mean() == pytest.approx(0.8, abs=0.02)


def test_it_validates_arrival_parameters() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="rate"):
        poisson_arrivals(0.0, 10.0, rng)
    with pytest.raises(ValueError, match="shape"):
        gamma_arrivals(1.0, 10.0, 0.0, rng)
    # 1e-12 used to hang: every gamma draw underflowed to 0, so the arrivals never left t = 0
    with pytest.raises(ValueError, match="shape=1e-12"):
        gamma_arrivals(1.0, 10.0, 1e-12, rng)
    with pytest.raises(ValueError, match="burstiness=1e-12"):
        make_workload("gamma", 1.0, 10.0, burstiness=1e-12)
    assert len(gamma_arrivals(10.0, 100.0, 0.01, rng)) > 0
    with pytest.raises(ValueError, match="burst_duration_s"):
        on_off_arrivals(1.0, 10.0, rng, burst_duration_s=90.0, period_s=60.0)
    with pytest.raises(ValueError, match="burst_factor"):
        on_off_arrivals(1.0, 10.0, rng, burst_factor=0.5)
    with pytest.raises(ValueError, match="period_s=1e-10 is too short"):  # not an OverflowError
        on_off_arrivals(1e-300, 1e300, rng, burst_duration_s=1e-10, period_s=1e-10)


@pytest.mark.parametrize("kind", ["poisson", "gamma", "burst"])
def test_it_names_a_rate_whose_arrivals_no_array_could_hold(kind: str) -> None:
    # numpy's own message was "Maximum allowed dimension exceeded", naming nothing.
    with pytest.raises(ValueError, match=r"rate=1e\+300.*arrivals"):
        make_workload(kind, 1e300, 300.0)


def test_it_rejects_unknown_kinds_datasets_and_options_listing_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="poisson, gamma, burst, trace"):
        make_workload("uniform", 1.0, 10.0)
    with pytest.raises(ValueError, match=r"alpaca.*sharegpt"):
        make_workload("poisson", 1.0, 10.0, dataset="wikitext")
    with pytest.raises(ValueError, match="burstiness"):
        make_workload("gamma", 1.0, 10.0, burst_factor=3.0)
    with pytest.raises(ValueError, match="rate"):
        make_workload("poisson", None, 10.0)


@pytest.mark.parametrize("seed", [-1, 1.5, "7"])
def test_it_rejects_a_seed_that_is_not_a_non_negative_integer_naming_it(seed: Any) -> None:
    # numpy's own message ("expected non-negative integer") did not say which argument.
    with pytest.raises(ValueError, match="seed"):
        make_workload("poisson", 1.0, 10.0, seed=seed)


@pytest.mark.parametrize(
    ("name", "prompt_mean", "output_mean"),
    [("sharegpt", 161.31, 337.99), ("alpaca", 19.31, 58.45), ("bookcorpus", 5102.0, 505.0)],
)
def test_it_fits_the_published_means(name: str, prompt_mean: float, output_mean: float) -> None:
    dist = get_length_dist(name)
    assert dist.prompt.mean == pytest.approx(prompt_mean, rel=1e-9)
    assert dist.output.mean == pytest.approx(output_mean, rel=1e-9)
    prompts, outputs = dist.sample(200_000, np.random.default_rng(0), max_context=1 << 20)
    assert prompts.mean() == pytest.approx(prompt_mean, rel=0.04)
    assert outputs.mean() == pytest.approx(output_mean, rel=0.04)


def test_it_registers_every_issue_dataset() -> None:
    assert set(available_length_dists()) >= {"sharegpt", "alpaca", "bookcorpus", "longbench", "humaneval"}
    with pytest.raises(ValueError, match="already registered"):
        register_length_dist(get_length_dist("sharegpt"))


@pytest.mark.parametrize("name", ["sharegpt", "alpaca", "bookcorpus", "longbench", "humaneval"])
def test_it_fits_every_request_in_the_context_window(name: str) -> None:
    prompts, outputs = get_length_dist(name).sample(20_000, np.random.default_rng(5), max_context=4096)
    assert prompts.min() >= 1 and outputs.min() >= 1
    assert (prompts + outputs).max() <= 4096


@settings(max_examples=50, deadline=None)
@given(
    st.sampled_from(["sharegpt", "alpaca", "bookcorpus", "longbench", "humaneval"]),
    st.integers(2, 40_000),
    st.integers(0, 2**32 - 1),
)
def test_it_fits_any_context_window(name: str, max_context: int, seed: int) -> None:
    prompts, outputs = get_length_dist(name).sample(500, np.random.default_rng(seed), max_context)
    assert prompts.min() >= 1 and outputs.min() >= 1
    assert (prompts + outputs).max() <= max_context


def test_it_caps_longbench_outputs_at_the_generation_limit() -> None:
    _, outputs = get_length_dist("longbench").sample(20_000, np.random.default_rng(0))
    assert outputs.max() <= 512


def test_it_fits_a_lognormal_to_mean_and_median() -> None:
    d = LogNormalLength.from_mean_median(300.0, 200.0)
    assert d.mean == pytest.approx(300.0) and d.median == pytest.approx(200.0)
    x = d.sample(200_000, np.random.default_rng(0))
    assert np.median(x) == pytest.approx(200.0, rel=0.02)
    with pytest.raises(ValueError, match="mean > median"):
        LogNormalLength.from_mean_median(100.0, 200.0)


def test_it_honours_a_custom_context_through_make_workload() -> None:
    reqs = make_workload("poisson", 2.0, 200.0, dataset="longbench", max_context=8192)
    assert all(r.prompt_tokens + r.output_tokens <= 8192 for r in reqs)
    assert max(r.prompt_tokens for r in reqs) > 4096  # long prompts are truncated, not dropped


def test_it_assigns_slo_classes_by_weight() -> None:
    reqs = make_workload("poisson", 20.0, 500.0, seed=1, slo_mix={"chat": 3.0, "batch": 1.0})
    share = sum(r.slo_class == "chat" for r in reqs) / len(reqs)
    assert share == pytest.approx(0.75, abs=0.02)
    assert all(r.slo_class == "x" for r in make_workload("poisson", 2.0, 20.0, slo_class="x"))


def test_it_replays_a_generic_trace_in_timestamp_order() -> None:
    reqs = load_trace(DATA / "trace_generic.csv")
    # rows sorted by (timestamp, line), shifted so the first arrives at 0
    assert reqs == [
        Request(0, 0.0, 100, 20, "interactive"),
        Request(1, 0.5, 250, 40, None),
        Request(2, 1.0, 64, 8, "interactive"),
        Request(3, 2.0, 30, 5, "batch"),
        Request(4, 2.0, 12, 3, None),
    ]
    fast = load_trace(DATA / "trace_generic.csv", time_scale=0.5, duration_s=1.0)
    assert [r.arrival for r in fast] == [0.0, 0.25, 0.5]


def test_it_replays_burstgpt_skipping_failed_requests() -> None:
    reqs = load_trace(DATA / "trace_burstgpt.csv")
    assert [(r.arrival, r.prompt_tokens, r.output_tokens) for r in reqs] == [
        (0.0, 472, 18),
        (113.0, 417, 30),
        (113.0, 1360, 254),
        (198.0, 236, 128),
    ]
    assert [r.req_id for r in reqs] == [0, 1, 2, 3]


def test_it_reads_the_burstgpt3_layout_by_header_name() -> None:
    reqs = load_trace(DATA / "trace_burstgpt3.csv")
    # the 7.5 s row failed (0 response tokens); the rest are shifted to start at 2.25 s
    assert [(r.arrival, r.prompt_tokens, r.output_tokens) for r in reqs] == [(0.0, 80, 40), (6.75, 300, 60)]


def test_it_rescales_a_trace_to_a_target_rate() -> None:
    reqs = make_workload("trace", 0.5, 1000.0, path=DATA / "trace_burstgpt.csv")
    # 4 requests at 0.5/s: the last arrives at (4 - 1) / 0.5 = 6 s
    assert reqs[-1].arrival == pytest.approx(6.0)
    as_recorded = make_workload("trace", None, 1000.0, path=DATA / "trace_burstgpt.csv")
    assert as_recorded[-1].arrival == 198.0


def test_a_rate_cannot_rescale_a_trace_whose_requests_share_one_instant(tmp_path: Path) -> None:
    # The rate was ignored (scale 1): 5 requests at one instant stayed there whatever rate was asked.
    p = tmp_path / "same.csv"
    p.write_text("timestamp,input_tokens,output_tokens\n" + "7.5,10,5\n" * 5)
    with pytest.raises(ValueError, match=r"rate=2\.0 cannot time-scale .*5 requests all arrive at one"):
        make_workload("trace", 2.0, 100.0, path=p)
    assert [r.arrival for r in make_workload("trace", None, 100.0, path=p)] == [0.0] * 5
    p.write_text("timestamp,input_tokens,output_tokens\n7.5,10,5\n")
    assert [r.arrival for r in make_workload("trace", 2.0, 100.0, path=p)] == [0.0]  # any rate


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("timestamp,input_tokens,output_tokens\n1.0,10,5\n2.0,ten,5\n", "line 3, column 'input_tokens'"),
        ("timestamp,input_tokens,output_tokens\n1.0,10,0\n", "line 2, column 'output_tokens'"),
        ("timestamp,input_tokens,output_tokens\n-1,10,5\n", "line 2, column 'timestamp'"),
        ("timestamp,input_tokens,output_tokens\n1.0,10\n", "line 2: expected 3 columns"),
        ("Timestamp,Model,Request tokens,Response tokens\n1,x,5,-3\n", "line 2, column 'Response tokens'"),
        ("time,prompt\n1,2\n", "line 1: header"),
        ("", "line 1: empty file"),
        # int() and float() read these; no CSV writer writes a count or a time so
        ("timestamp,input_tokens,output_tokens\n1.0,1_000,5\n", "line 2, column 'input_tokens'"),
        ("timestamp,input_tokens,output_tokens\n1.0,10,\u0665\n", "line 2, column 'output_tokens'"),
        ("timestamp,input_tokens,output_tokens\n1_5,10,5\n", "line 2, column 'timestamp'"),
        # csv.Error (field over the field size limit) was a traceback naming neither file nor line
        (
            'timestamp,input_tokens,output_tokens\n1,10,5\n2,"' + "x" * 200_000 + '",5\n',
            "line 3: not a readable",
        ),
    ],
)
def test_it_names_the_line_and_column_of_bad_csv(tmp_path: Path, body: str, match: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(body)
    with pytest.raises(ValueError, match=match):
        load_trace(p)


def test_it_round_trips_a_generated_workload_through_csv(tmp_path: Path) -> None:
    reqs = make_workload("burst", 3.0, 120.0, seed=2, slo_mix={"a": 1.0, "b": 1.0})
    write_trace(tmp_path / "w.csv", reqs)
    back = load_trace(tmp_path / "w.csv")
    shift = reqs[0].arrival
    assert [(r.prompt_tokens, r.output_tokens, r.slo_class) for r in back] == [
        (r.prompt_tokens, r.output_tokens, r.slo_class) for r in reqs
    ]
    assert [r.arrival for r in back] == pytest.approx([r.arrival - shift for r in reqs])


def test_it_rejects_invalid_length_distributions() -> None:
    with pytest.raises(ValueError, match="max_context"):
        LengthDistribution("x", LogNormalLength(1.0, 0.5), LogNormalLength(1.0, 0.5), max_context=1)
    with pytest.raises(ValueError, match="sigma"):
        LogNormalLength(1.0, -0.1)


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"max_requests": -1}, "max_requests"),
        ({"max_requests": 2.5}, "max_requests"),
        ({"duration_s": -5.0}, "duration_s"),
        ({"duration_s": float("nan")}, "duration_s"),
    ],
)
def test_a_trace_refuses_a_negative_or_nan_limit(kw: dict[str, Any], named: str) -> None:
    # They were taken: -1 requests or -5 s kept nothing, 2.5 requests kept 3, a NaN duration all.
    with pytest.raises(ValueError, match=named):
        load_trace(DATA / "trace_generic.csv", **kw)
    if named == "max_requests":
        with pytest.raises(ValueError, match=named):
            make_workload("trace", None, 100.0, path=DATA / "trace_generic.csv", **kw)


def test_it_reads_a_trace_saved_with_a_byte_order_mark(tmp_path: Path) -> None:
    # Spreadsheets export "CSV UTF-8" with a BOM; its header was refused as matching no layout.
    p = tmp_path / "excel.csv"
    p.write_bytes(b"\xef\xbb\xbftimestamp,input_tokens,output_tokens\r\n0,10,5\r\n1,20,3\r\n")
    got = [(r.arrival, r.prompt_tokens, r.output_tokens) for r in load_trace(p)]
    assert got == [(0.0, 10, 5), (1.0, 20, 3)]


@pytest.mark.parametrize(
    ("field", "values"),
    [
        ("arrival", (math.nan, math.inf, -1.0)),
        ("prompt_tokens", (math.nan, math.inf, 0, -5)),
        ("output_tokens", (math.nan, math.inf, 0, -5)),
    ],
)
def test_a_request_refuses_a_non_finite_or_out_of_range_field(field: str, values: tuple[float, ...]) -> None:
    # A NaN arrival or length passed the `< 0` / `< 1` checks (comparisons with NaN are false), and
    # an infinite arrival was accepted too; the simulator then ordered and sized requests by them.
    for value in values:
        kwargs: dict[str, Any] = {"req_id": 0, "arrival": 0.0, "prompt_tokens": 10, "output_tokens": 5}
        kwargs[field] = value
        with pytest.raises(ValueError, match=rf"self\.{field}=.* must be finite"):
            Request(**kwargs)
