"""Bad input to the serving CLIs, scripts/build_tiny_model.py and the benchmark scripts.

Each must answer with a one-line error naming the bad value (argparse's exit status 2, or 1), never
a traceback, and must leave no half-written output behind.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks.bench_io import out_dir, out_file
from serving.aqua.coordinator import CoordinatorServer
from serving.atomic_file import write_json_atomic, write_text_atomic
from serving.sim.cli import main as sim_main

REPO = Path(__file__).resolve().parents[2]
SIM = ["--rate", "1", "--duration", "5", "--no-progress"]
BENCHMARKS = (
    "aqua_burst",
    "aqua_steptrace",
    "chat_proxy",
    "distserve",
    "ecoserve",
    "placer",
    "sched_overhead",
    "sim_speed",
    "telemetry_ingest",
)


def run_cli(*argv: str, cwd: Path = REPO, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`python *argv` (a script, or -m and a module) with the repo importable; output captured."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def assert_clean_error(out: subprocess.CompletedProcess[str], named: str, code: int = 2) -> None:
    assert out.returncode == code, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert named in out.stderr.strip().splitlines()[-1], out.stderr


def sim_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The simulator's error line for `argv` (which must make it exit with status 2)."""
    with pytest.raises(SystemExit) as exc:
        sim_main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


# ----------------------------------------------------------------------------- python -m serving.sim
def test_the_simulator_rejects_a_negative_seed_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = sim_error([*SIM, "--seed", "-1", "--out", str(tmp_path / "x")], capsys)
    assert "--seed" in err and "'-1'" in err


@pytest.mark.parametrize("flag", ["--out", "--trace"])
def test_the_simulator_refuses_an_empty_path_rather_than_using_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = {"--out": [*SIM, "--out", ""], "--trace": ["--workload", "trace", "--trace", "", "--out", "x"]}
    err = sim_error(argv[flag], capsys)
    assert f"{flag}: ''" in err
    assert list(tmp_path.iterdir()) == []


def test_the_simulator_checks_out_before_it_simulates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("simulated before checking --out")

    monkeypatch.setattr("serving.sim.cli.EngineSim.run", must_not_run)
    err = sim_error([*SIM, "--out", str(blocker / "run")], capsys)
    assert str(blocker / "run") in err


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (b"\xff\xfetimestamp,input_tokens\n", "not a UTF-8"),
        (b"timestamp,input_tokens,output_tokens\n", "no requests"),
    ],
)
def test_the_simulator_names_a_trace_it_cannot_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, named: str
) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_bytes(content)
    err = sim_error(["--workload", "trace", "--trace", str(trace), "--out", str(tmp_path / "x")], capsys)
    assert str(trace) in err and named in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("where", ["missing.csv", "."])
def test_the_simulator_names_the_flag_of_a_trace_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    trace = tmp_path / where  # not there, or a directory
    err = sim_error(["--workload", "trace", "--trace", str(trace), "--out", str(tmp_path / "x")], capsys)
    assert f"--trace {trace}: cannot read it" in err
    assert not (tmp_path / "x").exists()


def test_the_simulator_refuses_a_generated_workload_with_no_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One request per second for a millisecond draws nothing: refused, as an empty trace is,
    # rather than a summary of nan latencies.
    err = sim_error(["--rate", "1", "--duration", "0.001", "--out", str(tmp_path / "x")], capsys)
    assert "--rate 1.0" in err and "--duration 0.001" in err and "no requests" in err
    assert not (tmp_path / "x").exists()


def test_the_simulator_names_a_rate_and_duration_too_large_to_generate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # --rate 1e9 --duration 300 asks numpy for 2.4 TiB of arrival times; the allocator's refusal
    # is stood in for here (with overcommit a real attempt may be OOM-killed instead).
    def refused(rng: object, rate: float) -> Callable[[int], Any]:
        def gaps(n: int) -> Any:
            raise MemoryError(f"Unable to allocate {n * 8} bytes")

        return gaps

    monkeypatch.setattr("serving.workload.arrivals._exponential_gaps", refused)
    err = sim_error(["--rate", "1e9", "--duration", "300", "--out", str(tmp_path / "x")], capsys)
    assert "--rate 1000000000.0" in err and "--duration 300.0" in err
    assert not (tmp_path / "x").exists()


def test_the_simulator_names_a_block_size_larger_than_the_kv_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = sim_error([*SIM, "--block-size", "100000000", "--out", str(tmp_path / "x")], capsys)
    assert "--block-size 100000000" in err and "--gpu-memory-utilization" not in err


def test_the_simulator_writes_no_partial_output_when_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt  # Ctrl-C while the report is being produced

    monkeypatch.setattr("serving.sim.report.build_figure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sim_main([*SIM, "--out", str(tmp_path / "run")])
    assert list((tmp_path / "run").iterdir()) == []  # no summary.json without its report


@pytest.mark.parametrize(
    ("write", "content", "error"),
    [
        (write_text_atomic, "half written \ud800", UnicodeEncodeError),  # fails part way through
        (write_json_atomic, {"ok": 1, "bad": object()}, TypeError),  # not JSON
    ],
    ids=["text", "json"],
)
def test_a_failed_write_keeps_the_previous_file(
    tmp_path: Path, write: Callable[[Path, Any], None], content: Any, error: type[Exception]
) -> None:
    path = tmp_path / "result.json"
    path.write_text("previous")
    with pytest.raises(error):
        write(path, content)
    assert path.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # no temporary file left


# ------------------------------------------------------------------- coordinator and producer processes
@pytest.mark.parametrize(
    ("args", "named"),
    [(["--mode", "-1"], "'-1'"), (["--mode", "7777"], "'7777'"), (["--socket", ""], "--socket ''")],
)
def test_the_coordinator_rejects_bad_flags_naming_them(args: list[str], named: str) -> None:
    with tempfile.TemporaryDirectory(prefix="aqua-") as d:  # short: Unix socket paths are limited
        sock = os.path.join(d, "c.sock")
        out = run_cli("-m", "serving.aqua.coordinator", "--socket", sock, *args, timeout=20)
    assert_clean_error(out, named)


def test_the_coordinator_names_a_socket_it_cannot_create() -> None:
    with tempfile.TemporaryDirectory(prefix="aqua-") as d:
        sock = os.path.join(d, "missing", "c.sock")
        out = run_cli("-m", "serving.aqua.coordinator", "--socket", sock, timeout=20)
    assert_clean_error(out, sock, code=1)


PRODUCER = ("-m", "serving.aqua.producer", "--socket", "/nonexistent/aqua.sock", "--nbytes", "10")


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--reclaim-after", "nan"),
        ("--reclaim-after", "-1"),
        ("--reclaim-after", "inf"),
        ("--reclaim-timeout", "nan"),
        ("--reclaim-timeout", "-5"),
    ],
)
def test_the_producer_rejects_bad_durations_naming_them(flag: str, value: str) -> None:
    assert_clean_error(run_cli(*PRODUCER, flag, value), f"{flag}: '{value}'")


@pytest.mark.parametrize("device", ["cuda:x", "cuda:", "cpu/x"])
def test_the_producer_rejects_a_malformed_device_before_connecting(device: str) -> None:
    assert_clean_error(run_cli(*PRODUCER, "--device", device), repr(device), code=1)


def test_the_producer_names_the_region_it_cannot_create(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A size within the bounds that the system still cannot back (`--nbytes` beyond /dev/shm's
    # free space is refused before, by the parser: tests/aqua/test_producer.py).
    from serving.aqua import producer

    def no_memory(device: str, nbytes: int) -> Any:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(producer, "_create_region", no_memory)
    with tempfile.TemporaryDirectory(prefix="aqua-") as d:
        server = CoordinatorServer(os.path.join(d, "c.sock"))
        server.start()
        try:
            code = producer.main(["--socket", server.socket_path, "--nbytes", "65536"])
        finally:
            server.stop()
    assert code == 1
    assert (
        "error: cannot create a 65536-byte region on cpu0: [Errno 12] Cannot allocate memory"
        in capsys.readouterr().err
    )


# ------------------------------------------------------------------------ scripts/build_tiny_model.py
@pytest.mark.parametrize(
    ("value", "named"),
    [("", "''"), ("a-file", "'a-file'"), ("a-file/model", "a-file/model")],
)
def test_build_tiny_model_rejects_an_unusable_out(tmp_path: Path, value: str, named: str) -> None:
    (tmp_path / "a-file").write_text("")
    out = run_cli(str(REPO / "scripts" / "build_tiny_model.py"), "--out", value, cwd=tmp_path, timeout=120)
    assert_clean_error(out, named)
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]  # nothing built into the cwd


def test_a_failed_tiny_model_build_leaves_no_model_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scripts.build_tiny_model import build_model

    class BrokenConfig:
        @staticmethod
        def from_pretrained(path: str) -> None:
            raise OSError("disk trouble")

    transformers = types.ModuleType("transformers")
    transformers.LlamaConfig = BrokenConfig  # type: ignore[attr-defined]
    transformers.LlamaForCausalLM = None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", transformers)
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    with pytest.raises(OSError, match="disk trouble"):
        build_model(tmp_path / "tiny-llama")
    assert list(tmp_path.iterdir()) == []  # neither a half-built model nor its scratch directory


# -------------------------------------------------------------------------------------- benchmarks
@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_checks_out_before_running(tmp_path: Path, name: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = run_cli(f"benchmarks/{name}.py", "--quick", "--out", str(blocker / "result.json"))
    assert_clean_error(out, f"{blocker} is not a directory")


@pytest.mark.parametrize("name", ["aqua_burst", "distserve", "ecoserve"])
@pytest.mark.parametrize(
    ("argv", "named"),
    [
        # The chart's default, --out with .html, was --out itself: written over the JSON at the end.
        (["--out", "{tmp}/r.html"], "--html (default: --out with .html): '{tmp}/r.html' is the --out file"),
        (["--out", "{tmp}/r.json", "--html", "{tmp}/r.json"], "--html: '{tmp}/r.json' is the --out file"),
        # The default was not checked at all: a traceback after the run.
        (["--out", "{tmp}/a-dir.json"], "'{tmp}/a-dir.html' is a directory"),
    ],
)
def test_benchmarks_with_a_chart_check_its_path_before_running(
    tmp_path: Path, name: str, argv: list[str], named: str
) -> None:
    (tmp_path / "a-dir.html").mkdir()
    for kept in ("r.html", "r.json"):
        (tmp_path / kept).write_text('{"kept": true}\n')
    out = run_cli(f"benchmarks/{name}.py", "--quick", *(a.format(tmp=tmp_path) for a in argv))
    assert_clean_error(out, named.format(tmp=tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-dir.html", "r.html", "r.json"]
    assert (tmp_path / "r.html").read_text() == (tmp_path / "r.json").read_text() == '{"kept": true}\n'


# Runs a benchmark (argv[1]) only up to its parsed arguments; prints them, and the paths out_file saw.
PARSE_ONLY = """
import argparse, json, runpy, sys
import benchmarks.bench_io as bench_io

seen, out_file, parse_args = [], bench_io.out_file, argparse.ArgumentParser.parse_args
bench_io.out_file = lambda text: seen.append(text) or out_file(text)

def parsed(self, *args, **kwargs):
    print(json.dumps({"out": str(parse_args(self, *args, **kwargs).out), "checked": seen}))
    raise SystemExit(0)

argparse.ArgumentParser.parse_args = parsed
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("name", sorted(set(BENCHMARKS) - {"chat_proxy", "telemetry_ingest"}))
def test_a_benchmarks_default_out_is_its_results_file_checked_like_a_given_one(
    tmp_path: Path, name: str
) -> None:
    # Four were Path("benchmarks/results/..."), relative to the working directory, and all were
    # Path defaults, which argparse does not pass through out_file: found bad only after the run.
    out = run_cli("-c", PARSE_ONLY, str(REPO / "benchmarks" / f"{name}.py"), "--quick", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    parsed = json.loads(out.stdout.strip().splitlines()[-1])
    default = str(REPO / "benchmarks" / "results" / f"{name}.json")
    assert parsed["out"] == default
    assert default in parsed["checked"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "flag", "value"),
    [
        ("placer", "--time-limit", "nan"),
        ("placer", "--time-limit", "0"),
        # Accepted: CP-SAT then ran the instances to optimality, for as long as that takes.
        ("placer", "--time-limit", "1e29"),
        ("ecoserve", "--fixed-rate", "-1"),
        ("ecoserve", "--overload-rate", "inf"),
        # Accepted: past the corpus, a ValueError traceback after the minutes of goodput searches.
        ("ecoserve", "--fixed-rate", "45"),
        ("ecoserve", "--overload-rate", "1e308"),
        ("ecoserve", "--seed", "-1"),
        ("sim_speed", "--seed", "-1"),
        # Accepted: random.Random(-1) is random.Random(1), a run reported as seed -1 was seed 1's.
        ("placer", "--seed", "-1"),
        ("chat_proxy", "--streams", "0"),
        # Accepted; the streams, past any open-file limit, start after minutes of overhead measurement.
        ("chat_proxy", "--streams", str(10**30)),
        ("telemetry_ingest", "--clients", "0"),
        # Accepted: a host row each was created, one by one, before any client connected.
        ("telemetry_ingest", "--clients", str(10**30)),
        ("aqua_steptrace", "--rounds", "0"),
        # Accepted: rounds of about 25 s each, for ever.
        ("aqua_burst", "--rounds", str(10**30)),
        ("aqua_steptrace", "--rounds", "101"),
        ("aqua_burst", "--long-tokens", "8"),
        ("aqua_burst", "--long-tokens", "4097"),
    ],
)
def test_benchmarks_reject_bad_numbers_naming_them(tmp_path: Path, name: str, flag: str, value: str) -> None:
    out = run_cli(f"benchmarks/{name}.py", "--quick", flag, value, "--out", str(tmp_path / "r.json"))
    assert_clean_error(out, f"{flag}: '{value}'")
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("abc", "argument --database-url: 'abc' is not a postgres:// (or sqlite://) URL"),
        ("sqlite:////nonexistent/dir/db.sqlite3", "--database-url 'sqlite:////nonexistent/dir/db.sqlite3')"),
    ],
)
def test_telemetry_ingest_names_a_database_url_it_cannot_use(tmp_path: Path, url: str, named: str) -> None:
    # Both were a CalledProcessError traceback (after manage.py migrate's own) out of setup_django.
    out = run_cli(
        "benchmarks/telemetry_ingest.py", "--quick", "--database-url", url, "--out", str(tmp_path / "r.json")
    )
    assert_clean_error(out, named)
    assert list(tmp_path.iterdir()) == []


def test_aqua_steptrace_refuses_a_blank_traces_folder(tmp_path: Path) -> None:
    out = run_cli(
        "benchmarks/aqua_steptrace.py", "--quick", "--traces", "", "--out", str(tmp_path / "r.json")
    )
    assert_clean_error(out, "argument --traces: '' is not a folder path")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["last", "parent"])
@pytest.mark.parametrize("check", ["out_file", "out_dir", "build_tiny_model", "serving.sim"])
def test_a_path_with_a_name_over_name_max_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], check: str, where: str
) -> None:
    # Path.exists() raises OSError for it ("File name too long"): each was a traceback.
    from scripts.build_tiny_model import _out_dir

    long = tmp_path / ("x" * 300) if where == "last" else tmp_path / ("x" * 300) / "out"
    if check == "serving.sim":
        err = sim_error([*SIM, "--out", str(long)], capsys)
    else:
        parse: Callable[[str], Any] = {
            "out_file": out_file,
            "out_dir": out_dir,
            "build_tiny_model": _out_dir,
        }[check]
        with pytest.raises(argparse.ArgumentTypeError) as exc:
            parse(str(long))
        err = str(exc.value)
    assert str(long)[:60] in err and "File name too long" in err
    assert list(tmp_path.iterdir()) == []
