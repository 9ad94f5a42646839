"""Names of the shared-memory segments producers create, and the sweep of dead owners' segments.

A producer unlinks its segment when it exits cleanly, and the multiprocessing resource tracker
does when the producer alone is killed. A SIGKILL of the producer's whole process group (the
tracker included), or of the tracker first, leaves the segment in /dev/shm for ever: host memory
nobody can use. So each name records its owner:

    aqua_<pid>_<start>_<pidns>_<random>      (pid, start time and pid namespace in hex but pid)

`<start>` is the owner's start time (clock ticks since boot, /proc/<pid>/stat), which tells the
owner from a later process given the same pid; `<pidns>` is the inode of its pid namespace,
without which a pid means nothing (containers may share /dev/shm).

`sweep_stale_segments()` (run as a producer and as a coordinator start) unlinks segments named so
whose owner is dead: same pid namespace as ours, owned by our user, and no process with that pid
and start time (or only its zombie) exists. Everything else is left alone: other names, other
namespaces, other users, and a segment whose owner cannot be told dead. Unlinking removes only
the name; a consumer that still maps the segment keeps reading it (see `LentRegionStore`).
Where /proc is missing, names carry the pid alone and are never swept.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"  # where POSIX shared-memory segments live on Linux
PREFIX = "aqua_"
_OWNED = re.compile(rf"{PREFIX}(\d+)_([0-9a-f]+)_([0-9a-f]+)_[0-9a-f]{{8}}")


def process_start(pid: int) -> int | None:
    """The start time of live process `pid` (clock ticks since boot); None if there is no such
    process, or only its zombie (it holds no memory any more).

    Raises:
        OSError: /proc could not tell (not Linux, no permission): the caller must not assume dead.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; fields resume after the
    # last ')'. state is field 3, starttime field 22.
    fields = stat[stat.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def pid_namespace() -> int | None:
    """The inode of this process's pid namespace; None where /proc cannot tell."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def segment_name() -> str:
    """A fresh segment name recording this process as its owner (see the module doc)."""
    pid = os.getpid()
    try:
        start = process_start(pid)
    except OSError:
        start = None
    ns = pid_namespace()
    if start is None or ns is None:  # cannot be swept safely: the pid alone, as before
        return f"{PREFIX}{pid}_{secrets.token_hex(6)}"
    return f"{PREFIX}{pid}_{start:x}_{ns:x}_{secrets.token_hex(4)}"


def _owner_dead(pid: int, start: int) -> bool:
    try:
        return process_start(pid) != start
    except (OSError, ValueError, IndexError):  # unreadable or unparsable: cannot tell
        return False


def sweep_stale_segments(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink the segments of dead owners (see the module doc); returns the names unlinked.

    Never raises: a sweep that cannot run (no /dev/shm, no /proc) unlinks nothing.
    """
    ns = pid_namespace()
    if ns is None:
        return []
    uid = os.geteuid()
    swept: list[str] = []
    try:
        entries = list(os.scandir(shm_dir))
    except OSError as exc:
        log.debug("aqua: no sweep of %s: %s", shm_dir, exc)
        return []
    for entry in entries:
        m = _OWNED.fullmatch(entry.name)
        if m is None or int(m.group(3), 16) != ns:
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid or not entry.is_file(follow_symlinks=False):
                continue
        except OSError:
            continue
        if not _owner_dead(int(m.group(1)), int(m.group(2), 16)):
            continue
        with contextlib.suppress(FileNotFoundError):  # another sweep (or a late owner) got it first
            os.unlink(entry.path)
            swept.append(entry.name)
            log.warning("aqua: unlinked shared-memory segment %s of dead process %s", entry.name, m.group(1))
    return sorted(swept)
