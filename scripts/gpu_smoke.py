"""GPU smoke check of Aqua on the CUDA build of vLLM 0.32 (one NVIDIA GPU, under 5 minutes).

    python scripts/gpu_smoke.py [--dtype float16]     # JSON to $OUT/gpu_smoke.json when OUT is set

Checks, each printed as a PASS/FAIL line:
  1. paged_kv_pinned:  PagedKV's CUDA path (gather on the device, ONE copy on a side stream into
     pinned DRAM, and back) round-trips random blocks exactly;
  2. paged_kv_peer:    the same into a CUDA IPC buffer exported by a producer process (a peer
     buffer on the same GPU when there is only one) and attached through its handle;
  3. engine_exact:     the tiny model with AquaScheduler + AquaConnector (lent region from that
     producer, then pinned DRAM) and a KV cache small enough for many preemptions gives the same
     greedy tokens (and logprobs within tolerance) as a run with a cache large enough for none;
  4. offload_used:     preemptions happened, KV was restored (no load failures), the lent region
     was used.
Exit status 0 when every check passes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from serving.argtypes import non_negative_float  # noqa: E402  (run as a file: REPO just added)
from serving.atomic_file import write_text_atomic  # noqa: E402

RESULTS: dict[str, Any] = {"checks": {}}
DTYPES = ("float16", "bfloat16", "float32")  # dtypes vLLM takes for the tiny model on a GPU


def check(name: str, ok: bool, detail: Any = None) -> bool:
    RESULTS["checks"][name] = {"pass": bool(ok), "detail": detail}
    print(
        f"{'PASS' if ok else 'FAIL'} {name} {json.dumps(detail, default=str) if detail is not None else ''}",
        flush=True,
    )
    return ok


def paged_roundtrip(dest: Any) -> bool:
    import torch

    from serving.aqua.offload.paged import PagedKV

    torch.manual_seed(0)
    caches = [torch.randn(64, 2, 8, 16, 128, device="cuda", dtype=torch.float16) for _ in range(4)]
    kv = PagedKV(caches, 64)
    ids = [5, 17, 3, 40, 41, 42]
    want = [c[ids].clone() for c in caches]
    kv.gather(ids, dest)
    for c in caches:
        c.zero_()  # the blocks are "overwritten" after preemption
    kv.scatter([1, 2, 3, 4, 5, 6], dest, len(ids))
    torch.cuda.synchronize()
    return all(torch.equal(c[1:7], w) for c, w in zip(caches, want, strict=True))


def start_lender(
    root: Path, nbytes: int
) -> tuple[subprocess.Popen[str], subprocess.Popen[str], str, dict[str, Any]]:
    sock = str(root / "coord.sock")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    coord = subprocess.Popen(
        [sys.executable, "-m", "serving.aqua.coordinator", "--socket", sock],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert coord.stdout is not None and "listening" in coord.stdout.readline()
    prod = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serving.aqua.producer",
            "--socket",
            sock,
            "--device",
            "cuda:0",
            "--nbytes",
            str(nbytes),
            "--producer-id",
            "gpu-smoke",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert prod.stdout is not None
    leased = json.loads(prod.stdout.readline())
    return coord, prod, sock, leased


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Aqua GPU smoke check")
    ap.add_argument("--dtype", choices=DTYPES, default="float16", help="the engines' dtype")
    # Finite and >= 0: nan or inf would make engine_exact meaningless.
    ap.add_argument("--logprob-tol", type=non_negative_float, default=0.05, help="largest logprob difference")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    import torch

    if not torch.cuda.is_available():
        check("cuda_available", False, "torch.cuda.is_available() is False")
        return finish(t0)
    RESULTS["gpu"] = torch.cuda.get_device_name(0)
    from serving.aqua.memory.registry import open_region
    from serving.aqua.offload.dram import DramStore

    pinned = DramStore(64 << 20).reserve("x", 64 << 20)
    assert pinned is not None
    check("paged_kv_pinned", pinned.is_pinned() and paged_roundtrip(pinned), {"pinned": pinned.is_pinned()})

    root = Path(tempfile.mkdtemp(prefix="aqua-gpu-smoke-"))
    coord, prod, sock, leased = start_lender(root, 256 << 20)
    try:
        region = open_region(leased["handle"])
        check("paged_kv_peer", paged_roundtrip(region.tensor(0, 64 << 20)), {"region": leased["region_id"]})
        region.close()
        engine_checks(sock, root, args)
    finally:
        for p in (prod, coord):
            p.terminate()
            p.wait(20)
    return finish(t0)


def engine_checks(sock: str, root: Path, args: argparse.Namespace) -> None:
    from scripts.build_tiny_model import build_model
    from serving.aqua.offload.stats import read_json
    from tests.vllm_aqua import engines

    model = build_model()
    prompts = engines.make_prompts(10, seed=1)
    big = engines.make_llm(model, 4096, dtype=args.dtype, scheduler=None)
    ref = engines.generate(big, prompts, 40)
    engines.shutdown(big)
    del big
    connector = engines.aqua_kv_transfer(
        coordinator=sock, consumer_id="gpu-smoke", lent_bytes=64 << 20, stats_dir=str(root)
    )
    small = engines.make_llm(
        model, 320, dtype=args.dtype, connector=connector, additional={"aqua_stats_dir": str(root)}
    )
    out = engines.generate(small, prompts, 40)
    engines.shutdown(small)
    same = [a.token_ids == b.token_ids for a, b in zip(out, ref, strict=True)]
    diff = engines.max_logprob_diff(out, ref)
    check(
        "engine_exact",
        all(same) and diff <= args.logprob_tol,
        {"same_tokens": sum(same), "of": len(same), "max_logprob_diff": diff},
    )
    sched = read_json(root / "scheduler.json", settle_s=0.3)
    worker = read_json(root / "offload-worker.json", settle_s=0.3)
    ok = (
        sched.get("preemptions", 0) > 0 and worker.get("loads", 0) > 0 and worker.get("load_failures", 1) == 0
    )
    check(
        "offload_used",
        ok and worker.get("saves_by_tier", {}).get("lent", 0) > 0,
        {"scheduler": sched, "worker": worker},
    )


def finish(t0: float) -> int:
    RESULTS["seconds"] = time.perf_counter() - t0
    RESULTS["pass"] = all(c["pass"] for c in RESULTS["checks"].values()) and bool(RESULTS["checks"])
    print(("PASS" if RESULTS["pass"] else "FAIL") + f" gpu_smoke in {RESULTS['seconds']:.0f} s", flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(out) / "gpu_smoke.json", json.dumps(RESULTS, indent=2, default=str))
    return 0 if RESULTS["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
