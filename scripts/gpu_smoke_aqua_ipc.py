"""GPU smoke check of Aqua's CUDA IPC regions: one NVIDIA GPU, under two minutes.

    .venv/bin/python scripts/gpu_smoke_aqua_ipc.py              # cuda:0 (peer buffer on the same GPU)
    .venv/bin/python scripts/gpu_smoke_aqua_ipc.py --device cuda:1
    .venv/bin/python scripts/gpu_smoke_aqua_ipc.py --device cpu0  # the same flow on shared memory

A coordinator runs in this process. A producer process allocates a buffer on the GPU, exports it
through CUDA IPC and leases it; a consumer process allocates from it, opens the handle, writes a
pattern from its own device tensor and from host bytes on the region's side stream and reads it
back; the producer then verifies the bytes in ITS tensor, files a reclaim, the consumer frees,
and the producer unleases. Also checked: a same-process attach (CUDA cannot IPC-open memory in
the exporting process) and the pinned DRAM fallback. Prints PASS/FAIL lines, then
RESULT PASS|FAIL; the exit status is 0 only if everything passed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ALLOC_BYTES = 64 << 20


def pattern(nbytes: int, seed: int, device: str) -> Any:
    import torch

    idx = torch.arange(nbytes, dtype=torch.int64, device="cpu" if device.startswith("cpu") else device)
    return ((idx * 7 + seed) % 251).to(torch.uint8)


def report(ok: bool, check: str, detail: str = "") -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {check}{': ' + detail if detail else ''}", flush=True)
    return ok


def send(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


# ------------------------------------------------------------------------------- producer
def producer(sock: str, device: str, nbytes: int) -> int:
    import torch

    from serving.aqua.coordinator import AquaClient
    from serving.aqua.producer import _create_region

    client = AquaClient(sock, name="smoke-producer")
    region = _create_region(device, nbytes)
    handle = region.handle()
    region_id = client.lease("smoke-producer", device, nbytes, handle)
    ok = True
    if device.startswith("cuda"):  # same-process attach aliases the exported tensor
        from serving.aqua.memory.cuda_ipc import CudaIpcRegion

        alias = CudaIpcRegion.attach(handle)
        alias.write(0, b"same-process")
        ok &= report(bytes(region.tensor(0, 12).cpu().numpy()) == b"same-process", "same-process attach")
        region.tensor(0, 12).zero_()
        alias.close()
    send({"event": "leased", "region_id": region_id, "handle_kind": handle["kind"]})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "verify":
            got = region.tensor(cmd["offset"], cmd["nbytes"])
            want = pattern(cmd["nbytes"], cmd["seed"], str(got.device))
            if got.is_cuda:
                torch.cuda.synchronize()
            ok &= report(bool(torch.equal(got, want)), "producer sees the consumer's bytes in its own buffer")
            send({"event": "verified"})
        elif cmd["op"] == "reclaim":
            t0 = time.monotonic()
            client.request_reclaim(region_id)
            done = client.wait_reclaimed(region_id, timeout=30)
            ok &= report(done, "reclaim completes once the consumer frees", f"{time.monotonic() - t0:.3f}s")
            if done:
                client.unlease(region_id)
            region.close()
            client.close()
            send({"event": "released", "ok": bool(ok)})
            return 0 if ok else 1
    return 1


# ------------------------------------------------------------------------------- consumer
def consumer(sock: str, nbytes: int, seed: int) -> int:
    import torch

    from serving.aqua.coordinator import AquaClient
    from serving.aqua.memory import open_region

    client = AquaClient(sock, name="smoke-consumer")
    alloc = client.allocate("smoke-consumer", nbytes, strict=True)
    assert alloc is not None
    region = open_region(alloc.handle)
    local = "cuda" if torch.cuda.is_available() and alloc.device.startswith("cuda") else "cpu"
    ok = report(True, "consumer opened the region", f"{alloc.handle['kind']} at offset {alloc.offset}")

    src = pattern(nbytes, seed, local)
    t0 = time.monotonic()
    region.write(alloc.offset, src)  # device -> lent memory (side stream, synchronised)
    dt = time.monotonic() - t0
    back = torch.empty_like(src)
    region.read_into(alloc.offset, back)
    ok &= report(
        bool(torch.equal(back, src)), "consumer write + read back", f"{nbytes / dt / 1e9:.2f} GB/s write"
    )

    host = bytes(range(256)) * 16
    region.write(alloc.offset + nbytes - len(host), host)  # host bytes path, then restore
    out = bytearray(len(host))
    region.read_into(alloc.offset + nbytes - len(host), out)
    ok &= report(bytes(out) == host, "host bytes round trip")
    region.write(alloc.offset + nbytes - len(host), src[-len(host) :])

    send({"event": "written", "offset": alloc.offset, "nbytes": nbytes, "seed": seed, "ok": bool(ok)})
    for line in sys.stdin:
        if json.loads(line)["op"] == "free":
            while not client.pending_reclaims("smoke-consumer"):
                time.sleep(0.01)
            region.close()
            client.free(alloc.alloc_id)
            client.close()
            send({"event": "freed"})
            return 0 if ok else 1
    return 1


# ------------------------------------------------------------------------------- orchestrator
def dram_check() -> bool:
    import torch

    from serving.aqua.memory.dram import DramBuffer

    buf = DramBuffer(1 << 20)
    ok = report(
        buf.pinned == torch.cuda.is_available(), "DRAM fallback pinned iff CUDA", f"pinned={buf.pinned}"
    )
    src = pattern(1 << 20, 3, "cuda" if torch.cuda.is_available() else "cpu")
    buf.write(0, src)
    back = torch.empty_like(src)
    buf.read_into(0, back)
    ok &= report(bool(torch.equal(back, src)), "DRAM fallback round trip")
    buf.close()
    return ok


def orchestrate(device: str) -> int:
    import torch

    from serving.aqua.coordinator import CoordinatorServer

    if device.startswith("cuda") and not torch.cuda.is_available():
        report(False, "CUDA available", "torch.cuda.is_available() is False")
        print("RESULT FAIL", flush=True)
        return 1
    if device.startswith("cuda"):
        index, count = int(device.split(":")[1]), torch.cuda.device_count()
        if index >= count:
            report(False, "CUDA device present", f"{device} asked for; this machine has {count} GPU(s)")
            print("RESULT FAIL", flush=True)
            return 1
        print(f"INFO {torch.cuda.get_device_name(index)}, torch {torch.__version__}")
    ok = dram_check()
    with tempfile.TemporaryDirectory(prefix="aqua-smoke-") as tmp:
        sock = os.path.join(tmp, "coord.sock")
        server = CoordinatorServer(sock)
        server.start()
        me = [sys.executable, str(Path(__file__).resolve()), "--socket", sock, "--device", device]
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True, "cwd": REPO}
        prod = subprocess.Popen([*me, "--role", "producer"], **pipes)  # type: ignore[call-overload]
        try:
            leased = expect(prod, "leased")
            cons = subprocess.Popen([*me, "--role", "consumer"], **pipes)  # type: ignore[call-overload]
            try:
                written = expect(cons, "written")
                ok &= bool(written["ok"]) and leased["handle_kind"] in ("cuda_ipc", "shm")
                tell(prod, {"op": "verify", **{k: written[k] for k in ("offset", "nbytes", "seed")}})
                expect(prod, "verified")
                tell(prod, {"op": "reclaim"})
                tell(cons, {"op": "free"})
                expect(cons, "freed")
                released = expect(prod, "released")
                ok &= bool(released["ok"])
                ok &= report(cons.wait(30) == 0 and prod.wait(30) == 0, "both processes exit cleanly")
            finally:
                cons.kill()
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            ok = report(False, "protocol run", str(exc))
        finally:
            prod.kill()
        stats = server.call(lambda c: c.stats())
        ok &= report(
            stats["regions"] == [], "coordinator holds nothing afterwards", json.dumps(stats["devices"])
        )
        server.stop()
    print(f"RESULT {'PASS' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


def expect(proc: subprocess.Popen[str], event: str) -> dict[str, Any]:
    """Relay the child's PASS/FAIL lines; return its next JSON event, which must be `event`."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{"):
            msg: dict[str, Any] = json.loads(line)
            if msg.get("event") != event:
                raise RuntimeError(f"expected {event!r}, got {msg}")
            return msg
        print(line, end="", flush=True)
    raise RuntimeError(f"child exited (status {proc.wait()}) before {event!r}")


def tell(proc: subprocess.Popen[str], cmd: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(cmd) + "\n")
    proc.stdin.flush()


def device_arg(text: str) -> str:
    """``cuda:<N>``, or ``cpu0`` for the shared-memory dry run; anything else is an argparse error
    (a typo such as ``gpu7`` must not quietly run, and pass, the dry run)."""
    if re.fullmatch(r"cuda:\d+|cpu0", text) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is neither cuda:<N> nor cpu0 (the dry run)")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--device", type=device_arg, default="cuda:0", help="cuda:<N> (default cuda:0) or cpu0 (dry run)"
    )
    parser.add_argument("--role", choices=["orchestrator", "producer", "consumer"], default="orchestrator")
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "producer":
        return producer(args.socket, args.device, 2 * ALLOC_BYTES)
    if args.role == "consumer":
        return consumer(args.socket, ALLOC_BYTES, seed=11)
    return orchestrate(args.device)


if __name__ == "__main__":
    sys.exit(main())
