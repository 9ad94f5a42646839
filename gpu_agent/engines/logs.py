"""Per-engine log files: reading their last lines, bounding what is sent, rotating them.

Engine output goes straight to `<deployment>.log` (the process holds the file), so the agent can
only rotate between runs: `rotate()` is called at every engine start. A crash loop therefore keeps
at most `backups + 1` files of about `max_bytes` each (plus one run's output); a single run that
logs without end still grows its file until the engine restarts.

Lines leave the host in frames, and the control plane's server (daphne) drops a message over
1 MiB without a close frame: the agent would reconnect, and be knocked off again by the next such
frame. `cap_lines()` bounds the lines of a frame well below that.
"""

from __future__ import annotations

import json
import os

LOG_MAX_BYTES = 64 * 2**20  # a log file at least this big is rotated when its engine starts
LOG_BACKUPS = 2  # rotated files kept: <deployment>.log.1 (newest) ... .log.<LOG_BACKUPS>
TAIL_READ_BYTES = 4 * 2**20  # at most this much of a log file's end is read for a tail
MAX_LINE_CHARS = 4000  # a longer line keeps its start and a marker
LOG_TAIL_BYTES = 256 * 2**10  # the lines of one `log_tail` frame, a quarter of daphne's limit
NOTE_BYTES = 200  # reserved by cap_lines() for its note on left-out lines


def tail_lines(path: str, n: int, block: int = 8192, max_read: int = TAIL_READ_BYTES) -> list[str]:
    """The last `n` lines of the file at `path` (without newlines); [] if it does not exist, and
    one line that says why when it cannot be read (no permission, a directory, an I/O error): the
    callers send lines on (a `log_tail` answer, a failed status), and an answer must still go.

    Reads backwards in blocks, so a large log costs only what the tail needs, and never more than
    `max_read` bytes: a log of a few huge lines (progress bars, dumped tensors) must not be read
    into memory whole. When that limit cuts a line, its end is kept.
    """
    if n <= 0:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            pos = f.tell()
            data = b""
            while pos > 0 and data.count(b"\n") <= n and len(data) < max_read:
                step = min(block, pos, max_read - len(data))
                pos -= step
                f.seek(pos)
                data = f.read(step) + data
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [unreadable_note(exc)]
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-n:]


def unreadable_note(exc: BaseException) -> str:
    """The line that stands for a log `exc` kept from being read."""
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
    return f"[cannot read the log: {reason}]"


def cap_lines(lines: list[str], max_bytes: int, max_line_chars: int = MAX_LINE_CHARS) -> list[str]:
    """The newest of `lines` whose JSON strings fit in `max_bytes`, each line at most
    `max_line_chars` characters (then cut, with a marker saying how much went).

    Sizes are measured as JSON-encoded (escapes and `\\uXXXX` included), which is what the frame
    carries. When older lines are left out, the first line says how many.
    """
    kept: list[str] = []
    used = NOTE_BYTES  # room for the note on left-out lines
    for line in reversed(lines):
        if len(line) > max_line_chars:
            line = (
                f"{line[:max_line_chars]} [... {len(line) - max_line_chars} more characters cut by the agent]"
            )
        size = len(json.dumps(line)) + 2  # with the ", " between items
        if used + size > max_bytes:
            break
        kept.append(line)
        used += size
    left_out = len(lines) - len(kept)
    if left_out:
        kept.append(f"[... {left_out} earlier line(s) left out: a tail is capped at {max_bytes} bytes]")
    kept.reverse()
    return kept


def rotate(path: str, max_bytes: int = LOG_MAX_BYTES, backups: int = LOG_BACKUPS) -> bool:
    """Move `path` to `path.1` (and `.1` to `.2`, ..., dropping the oldest) if it holds at least
    `max_bytes`; True if it did. With `backups` 0 the file is removed instead."""
    try:
        if os.path.getsize(path) < max_bytes:
            return False
    except FileNotFoundError:
        return False
    if backups <= 0:
        os.unlink(path)
        return True
    for i in range(backups - 1, 0, -1):
        older = f"{path}.{i}"
        if os.path.exists(older):
            os.replace(older, f"{path}.{i + 1}")
    os.replace(path, f"{path}.1")
    return True
