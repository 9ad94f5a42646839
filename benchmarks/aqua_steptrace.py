"""Where the burst's TTFT and the makespan go, step by step: benchmarks/aqua_burst.py's workload
on vLLM's default scheduler and ours, with every engine step traced (benchmarks/steptrace_sched.py).

    python benchmarks/aqua_steptrace.py [--quick] [--rounds N] [--out benchmarks/results/aqua_steptrace.json]

Same engines, config and workload as aqua_burst.py (one unmeasured round each first), taking turns.
For each engine and round the JSON has:
  * `steps`: engine steps from the first long request's arrival to the round's last step;
    `decode_step_ms`: median time a full decode step (every slot decoding) executes, from the end
    of schedule() to update_from_output(); `host_ms_per_step`: median scheduler-side time per
    step (schedule + update + the gap before the next schedule);
  * `burst`: the burst's p99 TTFT taken apart. `in_flight_ms`: from the first short's submission
    to the start of the first step that schedules a short (the step running when it arrived has to
    end first, and the front end tokenizes the burst meanwhile); `steps_to_last_first_token`: the
    steps from then until the one that gave the last short its first token, and `those_steps_ms`
    their time; `delivery_ms`: from that step's end (update_from_output) to the token's arrival in
    the benchmark's process (engine core output thread, ZMQ, vLLM's front-end output processing);
    `ttft_p99_ms`: the p99 TTFT as the client saw it.
  * the same for the `idle_burst` (the burst sent to an idle engine).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import aqua_burst as ab  # noqa: E402
from benchmarks.bench_io import bounded_int, default_out, out_dir, out_file  # noqa: E402
from serving.atomic_file import write_json_atomic  # noqa: E402

ENGINES = ("default", "ours")


def _base(req_id: str) -> str:
    """The benchmark's request id (vLLM's front end appends '-<random suffix>')."""
    return req_id.rsplit("-", 1)[0]


def _load(trace_file: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for path in sorted(Path(trace_file).parent.glob(Path(trace_file).name + ".*")):
        events += [json.loads(line) for line in path.read_text().splitlines() if line]
    return events


def _steps(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each schedule() with its step's end (the following update_from_output's start) and the
    scheduler-side time until the next schedule()."""
    scheds = [e for e in events if e["ev"] == "sched"]
    upds = [e for e in events if e["ev"] == "upd"]
    upd_starts = [u["t0"] for u in upds]
    out = []
    for i, s in enumerate(scheds):
        j = bisect.bisect_left(upd_starts, s["t1"])
        if j == len(upds):
            break
        nxt = scheds[i + 1]["t0"] if i + 1 < len(scheds) else upds[j]["t1"]
        host = (s["t1"] - s["t0"]) + (upds[j]["t1"] - upds[j]["t0"]) + max(0.0, nxt - upds[j]["t1"])
        out.append({**s, "end": upd_starts[j], "exec": upd_starts[j] - s["t1"], "host": host})
    return out


def _burst(
    steps: list[dict[str, Any]], adds: list[dict[str, Any]], reqs: list[dict[str, Any]], prefix: str
) -> dict[str, float]:
    burst = [r for r in reqs if r["id"].startswith(prefix)]
    ids = {r["id"] for r in burst}
    first_submit = min(r["submit"] for r in burst)
    first_add = min(a["t"] for a in adds if _base(a["id"]) in ids)
    last = max(burst, key=lambda r: r["first"] - r["submit"])
    mine = [s for s in steps if any(_base(i) in ids for i in s["ids"])]
    first_step = mine[0]
    ends = [s["end"] for s in steps]
    k = bisect.bisect_right(ends, last["first"]) - 1  # the last step to end before the token came
    span = [s for s in steps if first_step["t0"] <= s["t0"] and s["end"] <= ends[k]]
    ttft = sorted(r["first"] - r["submit"] for r in burst)
    return {
        "ttft_p99_ms": 1e3 * ab.pct(ttft, 99),
        "in_flight_ms": 1e3 * (first_step["t0"] - first_submit),
        "to_scheduler_ms": 1e3 * (first_add - first_submit),
        "steps_to_last_first_token": len(span),
        "those_steps_ms": 1e3 * (ends[k] - first_step["t0"]),
        "delivery_ms": 1e3 * (last["first"] - ends[k]),
    }


def _round(
    steps: list[dict[str, Any]],
    adds: list[dict[str, Any]],
    reqs: list[dict[str, Any]],
    tag: str,
    max_seqs: int,
) -> dict[str, Any]:
    longs = [r for r in reqs if r["id"].startswith(f"long-{tag}-")]
    shorts = {r["id"] for r in reqs if r["id"].startswith(f"short-{tag}-")}
    names = {r["id"] for r in longs} | shorts
    start = min(r["submit"] for r in longs)
    mine = [s for s in steps if s["t0"] >= start and any(_base(i) in names for i in s["ids"])]
    decodes = [s["exec"] for s in mine if s["n"] == max_seqs and s["tok"] == max_seqs]
    return {
        "steps": len(mine),
        "decode_step_ms": 1e3 * statistics.median(decodes),
        "host_ms_per_step": 1e3 * statistics.median(s["host"] for s in mine),
        "burst": _burst(steps, adds, reqs, f"short-{tag}-"),
        "idle_burst": _burst(steps, adds, reqs, f"idle-{tag}-"),
    }


def _medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def med(get: Any) -> float:
        return float(statistics.median(get(r) for r in rounds))

    keys = ("steps", "decode_step_ms", "host_ms_per_step")
    out: dict[str, Any] = {k: med(lambda r, k=k: r[k]) for k in keys}
    for part in ("burst", "idle_burst"):
        out[part] = {k: med(lambda r, k=k, p=part: r[p][k]) for k in rounds[0][part]}
    return out


async def _run(cfg: dict[str, Any], rounds: int, tmp: Path) -> dict[str, Any]:
    files = {name: str(tmp / f"{name}.jsonl") for name in ENGINES}
    made = {name: ab._make(name, cfg, trace_file=files[name]) for name in ENGINES}
    reqs: dict[str, list[dict[str, Any]]] = {name: [] for name in ENGINES}
    try:
        for llm, _, _ in made.values():
            await ab._workload(llm, cfg, tag="warmup")
        for rnd in range(rounds):
            for name in ab._round_order(ENGINES, rnd):
                await asyncio.sleep(ab.SWITCH_PAUSE_S)
                await ab._workload(made[name][0], cfg, tag=f"r{rnd}", log=reqs[name])
                await ab._idle_burst(made[name][0], cfg, tag=f"r{rnd}", log=reqs[name])
    finally:
        for llm, _, _ in made.values():
            llm.shutdown()
    time.sleep(0.5)  # the engine processes flush their trace files as they exit
    out: dict[str, Any] = {}
    for name in ENGINES:
        events = _load(files[name])
        steps, adds = _steps(events), [e for e in events if e["ev"] == "add"]
        per_round = [_round(steps, adds, reqs[name], f"r{i}", cfg["max_num_seqs"]) for i in range(rounds)]
        out[name] = {"rounds": per_round, "median": _medians(per_round)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="one measured round (about 2 minutes)")
    ap.add_argument("--out", type=out_file, default=default_out("aqua_steptrace"))
    ap.add_argument(
        "--rounds",
        type=bounded_int(1, ab.MAX_ROUNDS),
        default=None,
        help=f"measured rounds, at most {ab.MAX_ROUNDS} (default 5; 1 with --quick)",
    )
    ap.add_argument(
        "--traces", type=out_dir, default=None, help="keep the engines' step traces in this folder"
    )
    args = ap.parse_args()
    rounds = args.rounds or (1 if args.quick else 5)
    cfg = ab.burst_config(quick=False)
    t0 = time.perf_counter()
    if args.traces is not None:
        try:
            args.traces.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            ap.error(f"--traces: {str(args.traces)!r}: {e.strerror or e}")
        result = asyncio.run(_run(cfg, rounds, args.traces))
    else:
        with tempfile.TemporaryDirectory(prefix="aqua-steptrace-") as tmp:
            result = asyncio.run(_run(cfg, rounds, Path(tmp)))
    result.update({"config": cfg, "rounds": rounds, "quick": args.quick, "wall_s": time.perf_counter() - t0})
    write_json_atomic(args.out, result, sort_keys=True)
    for name in ENGINES:
        m = result[name]["median"]
        print(
            f"{name}: {m['steps']:.0f} steps/round, decode step {m['decode_step_ms']:.2f} ms, "
            f"host {m['host_ms_per_step']:.3f} ms/step"
        )
        for part in ("burst", "idle_burst"):
            b = m[part]
            print(
                f"  {part}: p99 TTFT {b['ttft_p99_ms']:.1f} ms = in flight {b['in_flight_ms']:.1f} "
                f"(to the scheduler {b['to_scheduler_ms']:.1f}) + "
                f"{b['steps_to_last_first_token']:.0f} steps {b['those_steps_ms']:.1f} + "
                f"delivery {b['delivery_ms']:.1f}"
            )
    print(f"wrote {args.out} in {result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
