"""Run the host coordinator standalone: `python -m serving.aqua.coordinator --socket PATH`.

Prints one line `{"event": "listening", "socket": PATH}` on stdout once it accepts connections;
SIGTERM or SIGINT stops it (clients see their connections close).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading

from serving.aqua.coordinator.coordinator import Coordinator
from serving.aqua.coordinator.limits import SessionLimits
from serving.aqua.coordinator.server import CoordinatorServer
from serving.argtypes import positive_int


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.aqua.coordinator", description=__doc__)
    parser.add_argument("--socket", required=True, help="Unix socket path to listen on")
    parser.add_argument("--mode", default="600", help="socket file permissions, octal (default 600)")
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    for name in ("max_leases", "max_allocations"):
        spec = SessionLimits.__dataclass_fields__[name]
        flag = "--" + name.replace("_", "-") + "-per-session"
        parser.add_argument(
            flag, dest=name, type=positive_int, default=spec.default, metavar="N", help=spec.metadata["help"]
        )
    args = parser.parse_args(argv)
    if not args.socket:
        parser.error("--socket '' is not a path")
    try:
        mode = int(args.mode, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:  # also refuses "-1" and setuid/sticky bits
        parser.error(f"--mode {args.mode!r} is not an octal permission 000..777 like 600")
    level = logging.getLevelName(args.log_level.upper())
    if not isinstance(level, int):
        parser.error(f"--log-level {args.log_level!r} is not one of DEBUG, INFO, WARNING, ERROR")
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s")

    limits = SessionLimits(max_leases=args.max_leases, max_allocations=args.max_allocations)
    server = CoordinatorServer(args.socket, Coordinator(limits), socket_mode=mode)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    try:
        server.start()
    except (RuntimeError, TimeoutError) as exc:
        print(f"error: --socket {args.socket}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"event": "listening", "socket": args.socket}), flush=True)
    while not done.wait(0.5):
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
