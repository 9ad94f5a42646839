"""The memory limit of the cgroup this process runs in (a container's), cgroup v2 or v1.

psutil reports the whole machine's RAM; in a container limited to less, an engine sized to that
would be killed by the kernel's OOM killer. `cgroup_memory` reads the limit and usage of every
cgroup from this process's own up to the hierarchy's root (a limit on an ancestor applies too), as
the kernel mounts them under `root` (/sys/fs/cgroup): v2 `memory.max` / `memory.current`, v1
`memory/memory.limit_in_bytes` / `memory.usage_in_bytes`. "max" (v2) and v1's huge "no limit"
value (PAGE_COUNTER_MAX pages, 9223372036854771712 on x86-64) are no limit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CGROUP_ROOT = "/sys/fs/cgroup"
SELF_CGROUP = "/proc/self/cgroup"
# v1 says "no limit" with a page-rounded 2^63 - 1; any limit from here up is none (2^62 B = 4 EiB).
V1_NO_LIMIT = 2**62


@dataclass(frozen=True, slots=True)
class CgroupMemory:
    """The tightest limit found, and the bytes still free under every limit."""

    limit_bytes: int
    free_bytes: int  # min over the limited cgroups of limit - (usage - inactive file cache)


def cgroup_memory(root: str = CGROUP_ROOT, self_cgroup: str = SELF_CGROUP) -> CgroupMemory | None:
    """This process's cgroup memory limit, or None when there is none (or no cgroup fs)."""
    v2, v1 = _own_paths(self_cgroup)
    found: list[tuple[int, int]] = []  # (limit, free) per limited cgroup
    for base, path, names in (
        (root, v2, ("memory.max", "memory.current", "inactive_file")),
        (
            os.path.join(root, "memory"),
            v1,
            ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
        ),
    ):
        for d in _dirs_up(base, path):
            limit = _read_int(os.path.join(d, names[0]))
            if limit is None or limit >= V1_NO_LIMIT:
                continue
            used = _read_int(os.path.join(d, names[1]))
            cache = _stat(os.path.join(d, "memory.stat"), names[2]) or 0
            working = 0 if used is None else max(0, used - cache)
            found.append((limit, max(0, limit - working)))
    if not found:
        return None
    return CgroupMemory(min(lim for lim, _ in found), min(free for _, free in found))


def _own_paths(self_cgroup: str) -> tuple[str, str]:
    """This process's v2 and v1 (memory controller) cgroup paths, "/" when unknown."""
    v2 = v1 = "/"
    try:
        with open(self_cgroup, encoding="utf-8") as f:
            for line in f:
                parts = line.rstrip("\n").split(":", 2)
                if len(parts) != 3:
                    continue
                if parts[0] == "0" and parts[1] == "":
                    v2 = parts[2] or "/"
                elif "memory" in parts[1].split(","):
                    v1 = parts[2] or "/"
    except OSError:
        pass
    return v2, v1


def _dirs_up(base: str, path: str) -> list[str]:
    """`base`/`path` and each of its parents up to `base`, those that exist. In a container
    without its own cgroup namespace, `path` is the host's name for its cgroup, mounted at `base`
    itself: only `base` exists then."""
    dirs = []
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    for n in range(len(parts), -1, -1):
        d = os.path.join(base, *parts[:n])
        if os.path.isdir(d):
            dirs.append(d)
    return dirs


def _read_int(path: str) -> int | None:
    """The file's integer ("max" and anything unreadable: None)."""
    try:
        with open(path, encoding="utf-8") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _stat(path: str, key: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return None
