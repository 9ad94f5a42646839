"""Run a command so that it is terminated when the agent dies, even by SIGKILL.

    python exec_guard.py --parent PID PROGRAM [ARGS...]     (`guarded(argv)` builds it)

Linux: asks the kernel for SIGTERM on parent death (prctl PR_SET_PDEATHSIG, kept across exec),
then execs PROGRAM in place, so the engine keeps this process's pid and process group. Without
this, an engine started in its own session outlives a killed agent and holds its GPU memory while
the restarted agent starts another one. The request only covers a parent that is alive when it is
made: an agent that died while this script was still starting (Python takes tens of milliseconds)
has already handed it to another parent, so it exits 1 unless its parent is still PID, the agent
that started it. Elsewhere it just execs. Standard library only: it runs as a plain script, before
the engine's environment is in effect.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
USAGE = "usage: exec_guard.py --parent PID PROGRAM [ARGS...]"


def guarded(argv: list[str]) -> list[str]:
    """The command that runs `argv` under this guard, for a child of the calling process."""
    return [sys.executable, os.path.abspath(__file__), "--parent", str(os.getpid()), *argv]


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[0] != "--parent" or not argv[1].isdigit():
        sys.exit(USAGE)
    parent, argv = int(argv[1]), argv[2:]
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            print(f"exec_guard: prctl failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        if os.getppid() != parent:  # the agent died before the request took effect
            sys.exit(1)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
