"""`LenderAgent`: a producer process that lends one region and gives it back when asked.

    python -m serving.aqua.producer --socket S --device cpu0 --nbytes N [--producer-id ID]
        [--reclaim-after SECONDS] [--reclaim-timeout SECONDS]

`cpu*` devices lend a POSIX shared-memory segment this process creates and owns; `cuda:I` lends
a CUDA IPC buffer on GPU I. Events go to stdout as JSON lines, flushed:

    {"event": "leased", "producer_id", "region_id", "device", "nbytes", "handle"}
    {"event": "reclaiming", "region_id"}
    {"event": "reclaimed", "region_id", "clean": true|false, "seconds"}

SIGUSR1 (or --reclaim-after) starts the reclaim: request it, poll until every consumer allocation
is freed, unlease, release the memory, exit 0. SIGTERM/SIGINT do the same. If consumers do not
give the region back within --reclaim-timeout the agent exits 3 anyway; its disconnect withdraws
the region (consumers see it in pending_reclaims with withdrawn=True).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
from typing import Any

from serving.aqua.coordinator import AquaClient
from serving.aqua.memory.base import Region
from serving.aqua.memory.shm import ShmRegion


class LenderAgent:
    """Lend `nbytes` of `device` memory through the coordinator at `socket_path`."""

    def __init__(self, socket_path: str, device: str, nbytes: int, producer_id: str | None = None) -> None:
        if nbytes <= 0:
            raise ValueError(f"{nbytes=} must be positive")
        if re.fullmatch(r"cpu\d*|cuda:\d+", device) is None:
            raise ValueError(f"{device=} must be cpu<N> (shared memory) or cuda:<N> (CUDA IPC)")
        self.device = device
        self.nbytes = nbytes
        self.producer_id = producer_id or f"producer-{os.getpid()}"
        self.client = AquaClient(socket_path, name=self.producer_id)
        self.region: Region | None = None
        self.region_id: str | None = None

    def lend(self) -> str:
        """Create the memory and lease it; returns the region id."""
        if self.region_id is not None:
            raise RuntimeError(f"already lending region {self.region_id}")
        try:
            self.region = _create_region(self.device, self.nbytes)
        except OSError as exc:
            raise RuntimeError(f"cannot create a {self.nbytes}-byte region on {self.device}: {exc}") from exc
        self.region_id = self.client.lease(self.producer_id, self.device, self.nbytes, self.region.handle())
        return self.region_id

    def reclaim(self, timeout: float, poll_interval: float = 0.01) -> bool:
        """Reclaim the region: wait for its consumer to free it, unlease, release the memory.

        Returns True if the consumer gave it back within `timeout`; False otherwise, in which case
        the region stays leased (and is withdrawn when this agent's connection closes).
        """
        if self.region_id is None:
            return True
        self.client.request_reclaim(self.region_id)
        if not self.client.wait_reclaimed(self.region_id, timeout, poll_interval):
            return False
        self.client.unlease(self.region_id)
        self.region_id = None
        if self.region is not None:
            self.region.close()
            self.region = None
        return True

    def close(self) -> None:
        """Disconnect (withdrawing anything still leased) and release the memory."""
        self.client.close()
        if self.region is not None:
            self.region.close()
            self.region = None


def _create_region(device: str, nbytes: int) -> Region:
    if device.startswith("cuda:"):
        from serving.aqua.memory.cuda_ipc import CudaIpcRegion

        return CudaIpcRegion.create(nbytes, int(device.split(":", 1)[1]))
    return ShmRegion.create(nbytes, device=device)


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= threading.TIMEOUT_MAX:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(
            f"{text!r} must be a number of seconds in 0..{threading.TIMEOUT_MAX:.0f}"
        )
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.aqua.producer", description=__doc__)
    parser.add_argument("--socket", required=True, help="the coordinator's Unix socket")
    parser.add_argument("--device", default="cpu0", help="cpu<N> (shared memory) or cuda:<N>")
    parser.add_argument("--nbytes", type=int, required=True, help="bytes to lend")
    parser.add_argument("--producer-id", default=None, help="producer name (default producer-<pid>)")
    parser.add_argument(
        "--reclaim-after", type=_seconds, default=None, help="reclaim after this many seconds"
    )
    parser.add_argument("--reclaim-timeout", type=_seconds, default=30.0, help="give up waiting after (s)")
    args = parser.parse_args(argv)
    if args.nbytes <= 0:
        parser.error(f"--nbytes {args.nbytes} must be positive")

    go = threading.Event()
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: go.set())
    try:
        agent = LenderAgent(args.socket, args.device, args.nbytes, args.producer_id)
        region_id = agent.lend()
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    assert agent.region is not None
    _emit(
        "leased",
        producer_id=agent.producer_id,
        region_id=region_id,
        device=args.device,
        nbytes=args.nbytes,
        handle=agent.region.handle(),
    )
    go.wait(args.reclaim_after)
    _emit("reclaiming", region_id=region_id)
    start = time.monotonic()
    clean = agent.reclaim(args.reclaim_timeout)
    _emit("reclaimed", region_id=region_id, clean=clean, seconds=round(time.monotonic() - start, 4))
    agent.close()
    return 0 if clean else 3


if __name__ == "__main__":
    sys.exit(main())
