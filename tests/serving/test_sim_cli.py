"""`python -m serving.sim`: outputs and flag validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from serving.metrics.records import RequestRecord
from serving.sim.cli import main
from serving.sim.preemption import PeerStore
from serving.sim.report import binned_percentiles, build_figure
from serving.workload.request import Request

REQUIRED = ("ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99", "throughput_tokens_per_s", "attainment")


def test_it_writes_a_summary_and_an_offline_html_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    argv = ["--workload", "burst", "--rate", "4", "--duration", "20", "--seed", "1", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in REQUIRED:
        assert isinstance(summary[key], float)
    assert summary["ttft_p50"] <= summary["ttft_p99"] and summary["tbt_p50"] <= summary["tbt_p99"]
    assert 0 <= summary["attainment"] <= 1 and summary["finished"] == summary["requests"] > 0
    assert summary["run"]["seed"] == 1 and summary["run"]["policy"] == "fcfs"
    html = (out / "report.html").read_text()
    assert "TTFT by arrival time" in html and 'src="https://cdn.plot.ly' not in html and len(html) > 1_000_000
    assert "ttft_p99" in capsys.readouterr().out
    # Same seed, same figures.
    assert main([*argv[:-1], str(tmp_path / "again"), "--no-progress"]) == 0
    again = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert {k: again[k] for k in REQUIRED} == {k: summary[k] for k in REQUIRED}


def test_a_tighter_slo_lowers_attainment(tmp_path: Path) -> None:
    base = ["--rate", "8", "--duration", "20", "--no-progress"]
    main([*base, "--out", str(tmp_path / "a")])
    main([*base, "--out", str(tmp_path / "b"), "--ttft-slo-ms", "30", "--tbt-slo-ms", "10"])
    loose = json.loads((tmp_path / "a" / "summary.json").read_text())["attainment"]
    tight = json.loads((tmp_path / "b" / "summary.json").read_text())["attainment"]
    assert tight < loose


def test_it_simulates_offload_to_lent_memory_with_a_reclaim(tmp_path: Path) -> None:
    argv = ["--rate", "20", "--duration", "10", "--kv-blocks", "600", "--no-progress", "--out", str(tmp_path)]
    argv += ["--preemption-mode", "offload_peer", "--peer-memory-gib", "1", "--reclaim-at", "5"]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (
        summary["preemptions"] > 0
        and summary["bytes_moved"] > 0
        and summary["finished"] == summary["requests"]
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--policy", "nope"], "'nope'"),
        (["--model", "gpt-5"], "'gpt-5'"),
        (["--gpu", "tpu"], "'tpu'"),
        (["--rate", "-3"], "'-3'"),
        (["--rate", "fast"], "'fast'"),
        (["--duration", "0"], "'0'"),
        (["--preemption-mode", "swap"], "'swap'"),
        (["--workload", "trace"], "--trace"),
        (["--gpu-memory-utilization", "1.5"], "1.5"),
        (["--peer-memory-gib", "2"], "offload_peer"),
        # An OverflowError traceback (its bytes overflow a float).
        (["--peer-memory-gib", "1e300", "--preemption-mode", "offload_peer"], "--peer-memory-gib 1e+300"),
        (["--kv-blocks", "0"], "'0'"),
        # Accepted and simulated (10**30 GPUs' worth of KV cache).
        (["--tp", str(10**30)], f"--tp: '{10**30}' must be in 1..64"),
        (["--tp", "40"], "--tp 40 is more than the 32 attention heads of llama-3-8b"),
        (["--tp", "3"], "--tp 3 does not divide the 32 attention heads of llama-3-8b"),
        (["--tp", "16", "--model", "llama-2-13b"], "--tp 16 does not divide the 40 attention heads"),
    ],
)
def test_it_rejects_bad_flags_naming_the_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], named: str
) -> None:
    base = ["--rate", "1", "--duration", "5", "--out", str(tmp_path / "x")]
    with pytest.raises(SystemExit) as exc:
        main([*base, *args])
    assert exc.value.code == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # nothing half-written


def test_a_model_that_does_not_fit_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["--model", "llama-3-70b", "--gpu", "h100", "--rate", "1", "--out", str(tmp_path / "x")])
    assert "llama-3-70b" in capsys.readouterr().err


def test_binned_percentiles_summarise_each_time_bin() -> None:
    import numpy as np

    t = np.repeat(np.arange(10.0), 100)
    v = np.tile(np.arange(100.0), 10)
    b = binned_percentiles(t, v, bins=10)
    assert len(b["t"]) == 10 and np.allclose(b["p50"], 49.5) and np.allclose(b["p99"], 98.01)


def test_the_figure_has_both_series_and_distributions() -> None:
    recs = [RequestRecord(i, float(i), 10, 3, [i + 0.5, i + 0.6, i + 0.8]) for i in range(50)]
    fig = build_figure(recs, "t")
    kinds = sorted(trace.type for trace in fig.data)
    assert kinds == ["bar", "bar", "scattergl", "scattergl"]


def test_a_reclaim_after_the_last_request_does_not_dilute_throughput(tmp_path: Path) -> None:
    # The engine idles until the reclaim to apply it; that idle time is not part of the run.
    base = ["--rate", "1", "--duration", "10", "--no-progress", "--preemption-mode", "offload_peer"]
    base += ["--peer-memory-gib", "1"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0
    assert main([*base, "--reclaim-at", "1000", "--out", str(tmp_path / "b")]) == 0
    plain = json.loads((tmp_path / "a" / "summary.json").read_text())
    late = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert late["run"]["simulated_s"] == 1000.0
    assert late["throughput_tokens_per_s"] == plain["throughput_tokens_per_s"] > 0


def test_generated_prompts_fit_the_models_context_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # longbench prompts (~8,700 tokens) were simulated whole on llama-2-13b, whose window is 4,096.
    import serving.sim.cli as cli

    drawn: list[Request] = []
    real = cli.make_workload

    def capture(*args: Any, **kw: Any) -> list[Request]:
        out = real(*args, **kw)
        drawn.extend(out)
        return out

    monkeypatch.setattr(cli, "make_workload", capture)
    argv = ["--model", "llama-2-13b", "--gpu", "a100", "--dataset", "longbench", "--rate", "0.5"]
    assert main([*argv, "--duration", "20", "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    assert drawn and max(r.prompt_tokens + r.output_tokens for r in drawn) <= 4096
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["run"]["max_context"] == 4096


def test_a_trace_is_measured_over_its_own_span_not_the_default_duration(tmp_path: Path) -> None:
    # 40 requests over 10 s replayed with the default --duration (300 s): throughput was divided by
    # 300 s instead of the ~11 s the run took (measured 16.4 instead of 442.5 tokens/s).
    trace = tmp_path / "t.csv"
    rows = [f"{0.25 * i:.2f},{100 + 7 * i},{50 + 3 * i}" for i in range(40)]
    trace.write_text("timestamp,input_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    base = ["--workload", "trace", "--trace", str(trace), "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0
    assert main([*base, "--duration", "20", "--out", str(tmp_path / "b")]) == 0
    default = json.loads((tmp_path / "a" / "summary.json").read_text())
    covering = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert default["finished"] == covering["finished"] == 40
    tokens = sum(50 + 3 * i for i in range(40))
    # every token was emitted by the end of the simulated run, and none after it
    assert default["throughput_tokens_per_s"] >= tokens / default["run"]["simulated_s"]
    assert default["throughput_tokens_per_s"] == covering["throughput_tokens_per_s"]


def test_a_trace_run_reports_its_own_window_and_names_the_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # summary.json said duration_s 300 (the unused --duration default) for a 9.75 s trace, and the
    # report's title "... trace @ None req/s · seed 0" (a replay draws nothing from a seed).
    trace = tmp_path / "t.csv"
    rows = [f"{0.25 * i:.2f},100,20" for i in range(40)]
    trace.write_text("timestamp,input_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    import serving.sim.cli as cli

    titles: list[str] = []
    real = cli.render_report

    def render(records: list[RequestRecord], title: str) -> str:
        titles.append(title)
        return real(records, title)

    monkeypatch.setattr(cli, "render_report", render)
    base = ["--workload", "trace", "--trace", str(trace), "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0
    assert main([*base, "--rate", "2", "--out", str(tmp_path / "b")]) == 0
    recorded = json.loads((tmp_path / "a" / "summary.json").read_text())["run"]
    scaled = json.loads((tmp_path / "b" / "summary.json").read_text())["run"]
    assert recorded["duration_s"] == 9.75 and scaled["duration_s"] == pytest.approx(39 / 2)
    assert recorded["trace"] == str(trace) and recorded["dataset"] is None
    assert titles[0].endswith("trace t.csv as recorded · 40 requests") and "seed" not in titles[0]
    assert titles[1].endswith("trace t.csv @ 2.0 req/s · 40 requests")


def test_a_rate_cannot_scale_a_trace_whose_requests_share_one_instant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --rate was silently ignored: the requests stayed at t = 0, as recorded.
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,input_tokens,output_tokens\n" + "5,100,20\n" * 8)
    base = ["--workload", "trace", "--trace", str(trace), "--no-progress"]
    with pytest.raises(SystemExit) as exc:
        main([*base, "--rate", "4", "--out", str(tmp_path / "x")])
    assert exc.value.code == 2
    assert "rate=4.0 cannot time-scale" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main([*base, "--out", str(tmp_path / "y")]) == 0  # replayed as recorded: a burst at 0
    one = tmp_path / "one.csv"
    one.write_text("timestamp,input_tokens,output_tokens\n5,100,20\n")  # one request: any rate
    assert (
        main(
            [
                "--workload",
                "trace",
                "--trace",
                str(one),
                "--rate",
                "4",
                "--no-progress",
                "--out",
                str(tmp_path / "z"),
            ]
        )
        == 0
    )


def test_a_trace_given_with_a_generated_workload_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It was silently ignored: a Poisson run was simulated and reported.
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,input_tokens,output_tokens\n0,100,20\n")
    with pytest.raises(SystemExit) as exc:
        main(["--rate", "1", "--trace", str(trace), "--out", str(tmp_path / "x"), "--no-progress"])
    assert exc.value.code == 2
    assert f"--trace {trace} is only read with --workload trace" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(("flag", "value"), [("--dataset", "longbench"), ("--seed", "7")])
def test_a_dataset_or_seed_given_with_a_trace_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    # Both were silently ignored: a trace brings its own lengths and its replay draws nothing, so
    # --seed 7 gave the run of --seed 0 (and recorded seed 7 in summary.json).
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,input_tokens,output_tokens\n0,100,20\n1,80,10\n")
    base = ["--workload", "trace", "--trace", str(trace), "--no-progress"]
    with pytest.raises(SystemExit) as exc:
        main([*base, flag, value, "--out", str(tmp_path / "x")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag} {value} is only" in err and "not --workload trace" in err
    assert not (tmp_path / "x").exists()
    assert main([*base, "--out", str(tmp_path / "y")]) == 0  # without them: replayed
    run = json.loads((tmp_path / "y" / "summary.json").read_text())["run"]
    assert run["seed"] is None and run["dataset"] is None


@pytest.mark.parametrize(("gpu", "link"), [("a100", "nvlink3"), ("h100", "nvlink4")])
def test_offloads_to_lent_memory_cross_the_gpus_own_nvlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu: str, link: str
) -> None:
    # The peer store kept its default NVLink 4 on every GPU: an A100's offloads moved at 450 GB/s.
    import serving.sim.cli as cli

    links: list[str] = []

    class Spy(cli.EngineSim):
        def run(self, *args: Any, **kw: Any) -> list[RequestRecord]:
            assert isinstance(self.store, PeerStore)
            links.append(self.store.peer_link.name)
            return super().run(*args, **kw)

    monkeypatch.setattr(cli, "EngineSim", Spy)
    argv = ["--model", "llama-2-13b", "--gpu", gpu, "--rate", "2", "--duration", "5", "--kv-blocks", "600"]
    argv += [
        "--preemption-mode",
        "offload_peer",
        "--peer-memory-gib",
        "1",
        "--no-progress",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    assert links == [link]
