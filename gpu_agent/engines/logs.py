"""Per-engine log files and reading their last lines."""

from __future__ import annotations

import os


def tail_lines(path: str, n: int, block: int = 8192) -> list[str]:
    """The last `n` lines of the file at `path` (without newlines); [] if it does not exist.

    Reads backwards in blocks, so a large log costs only what the tail needs.
    """
    if n <= 0:
        return []
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return []
    with f:
        f.seek(0, os.SEEK_END)
        pos = f.tell()
        data = b""
        while pos > 0 and data.count(b"\n") <= n:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-n:]
