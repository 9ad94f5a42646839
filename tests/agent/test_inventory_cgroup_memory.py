"""A CPU host in a container registers the container's cgroup memory limit, not the machine's RAM
(psutil's), when the limit is smaller: cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from gpu_agent.inventory import CpuInventory

GIB = 2**30


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def inventory(root: Path, self_cgroup: str = "0::/\n") -> CpuInventory:
    write(root / "self_cgroup", self_cgroup)
    return CpuInventory(cgroup_root=str(root / "fs"), self_cgroup=str(root / "self_cgroup"))


def test_it_reports_a_cgroup_v2_limit_smaller_than_the_machine(tmp_path: Path) -> None:
    write(tmp_path / "fs/memory.max", f"{GIB}\n")
    write(tmp_path / "fs/memory.current", f"{GIB // 2}\n")
    write(tmp_path / "fs/memory.stat", f"anon 1\ninactive_file {GIB // 4}\n")
    inv = inventory(tmp_path)
    (dev,) = inv.describe()
    assert dev.memory_total_bytes == GIB < psutil.virtual_memory().total
    (s,) = inv.sample()
    # The reclaimable page cache is free: 1 GiB - (0.5 GiB - 0.25 GiB).
    assert s.memory_free_bytes <= GIB * 3 // 4 and s.memory_used_bytes + s.memory_free_bytes == GIB


def test_it_reports_a_cgroup_v1_limit_of_its_own_cgroup(tmp_path: Path) -> None:
    own = tmp_path / "fs/memory/docker/abc"
    write(own / "memory.limit_in_bytes", f"{2 * GIB}\n")
    write(own / "memory.usage_in_bytes", f"{GIB}\n")
    write(tmp_path / "fs/memory/memory.limit_in_bytes", "9223372036854771712\n")  # root: no limit
    inv = inventory(tmp_path, "12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    assert inv.describe()[0].memory_total_bytes == 2 * GIB
    (s,) = inv.sample()
    assert s.memory_free_bytes <= GIB and s.memory_used_bytes + s.memory_free_bytes == 2 * GIB


def test_a_parents_limit_applies(tmp_path: Path) -> None:
    write(tmp_path / "fs/kubepods/memory.max", f"{3 * GIB}\n")
    write(tmp_path / "fs/kubepods/pod1/memory.max", "max\n")
    inv = inventory(tmp_path, "0::/kubepods/pod1\n")
    assert inv.describe()[0].memory_total_bytes == 3 * GIB


@pytest.mark.parametrize(
    ("files", "self_cgroup"),
    [
        ({"memory.max": "max\n"}, "0::/\n"),
        ({"memory/memory.limit_in_bytes": "9223372036854771712\n"}, "4:memory:/\n"),
        ({"memory.max": "not a number\n"}, "0::/\n"),
        ({}, "0::/\n"),  # no cgroup filesystem at all
        ({"memory.max": f"{2**70}\n"}, "0::/\n"),  # a limit past the machine's RAM
    ],
)
def test_no_limit_or_a_larger_one_leaves_the_machines_memory(
    tmp_path: Path, files: dict[str, str], self_cgroup: str
) -> None:
    for name, text in files.items():
        write(tmp_path / "fs" / name, text)
    inv = inventory(tmp_path, self_cgroup)
    assert inv.describe()[0].memory_total_bytes == psutil.virtual_memory().total
