"""The benchmarks' path types (benchmarks/bench_io.py): `--out PATH` and folder arguments are checked
before a run, so a path the result cannot be written to is refused naming it instead of failing
after minutes of measuring."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks.bench_io import out_dir, out_file
from serving.atomic_file import write_json_atomic


@pytest.mark.parametrize(
    "value",
    # A final "/", "/." or "/.." names a folder, even one not made yet: the first two were written
    # as a file of the folder's name, the last failed (renamed over a directory) after the run.
    ["", ".", "{tmp}", "{tmp}/a-file/result.json", "/dev/null", "{tmp}/new/", "{tmp}/new/.", "{tmp}/new/.."],
)
def test_the_benchmark_out_type_refuses_paths_it_could_not_write(tmp_path: Path, value: str) -> None:
    (tmp_path / "a-file").write_text("")
    text = value.format(tmp=tmp_path)
    with pytest.raises(argparse.ArgumentTypeError) as err:
        out_file(text)
    assert repr(text) in str(err.value)


@pytest.mark.parametrize("where", ["/proc/x", "/sys/x.json", "{tmp}/" + "x" * 240])
def test_the_benchmark_out_type_refuses_a_file_it_could_not_create(tmp_path: Path, where: str) -> None:
    # As root, os.access() allowed /proc and /sys, which refuse new files; a name that fits NAME_MAX
    # did not leave room for the temporary file's. The write failed at the end, the run's result lost.
    text = where.format(tmp=tmp_path)
    with pytest.raises(argparse.ArgumentTypeError) as err:
        out_file(text)
    assert f"{text!r}: cannot create a file in" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_a_benchmark_out_that_is_a_symlink_writes_its_target_and_keeps_the_link(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    target = tmp_path / "runs" / "r.json"
    target.write_text("{}")
    link = tmp_path / "latest.json"
    link.symlink_to(Path("runs") / "r.json")  # relative, as `ln -s runs/r.json latest.json` makes it
    write_json_atomic(out_file(str(link)), {"run": 2})
    assert link.is_symlink() and json.loads(link.read_text()) == {"run": 2}
    assert json.loads(target.read_text()) == {"run": 2}
    dangling = tmp_path / "next.json"
    dangling.symlink_to(tmp_path / "runs" / "new" / "r.json")  # its target's folder made at the end
    write_json_atomic(out_file(str(dangling)), {"run": 3})
    assert dangling.is_symlink() and json.loads(dangling.read_text()) == {"run": 3}


def test_the_benchmark_out_type_leaves_nothing_behind_where_it_can_write(tmp_path: Path) -> None:
    assert out_file(str(tmp_path / "new" / "r.json")) == tmp_path / "new" / "r.json"
    assert out_file(str(tmp_path / "r.json")) == tmp_path / "r.json"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["", " ", "{tmp}/a-file"])
def test_the_benchmark_folder_type_refuses_a_blank_path_or_a_file(tmp_path: Path, value: str) -> None:
    # aqua_steptrace --traces '' was Path(''): the step traces went into the current directory.
    (tmp_path / "a-file").write_text("")
    text = value.format(tmp=tmp_path)
    with pytest.raises(argparse.ArgumentTypeError) as err:
        out_dir(text)
    assert repr(text) in str(err.value)
    assert out_dir(str(tmp_path / "new" / "traces")) == tmp_path / "new" / "traces"


@pytest.mark.parametrize("where", ["/proc/self", "/proc/self/traces", "{tmp}/a-file/traces"])
def test_the_benchmark_folder_type_refuses_a_folder_it_could_not_write_in(tmp_path: Path, where: str) -> None:
    # /proc/self exists and is a folder: it was taken, and the engines failed on their first trace.
    (tmp_path / "a-file").write_text("")
    text = where.format(tmp=tmp_path)
    with pytest.raises(argparse.ArgumentTypeError) as err:
        out_dir(text)
    assert repr(text) in str(err.value)
    assert out_dir(str(tmp_path)) == tmp_path
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]
