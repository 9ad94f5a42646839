"""What the benchmark scripts share on their command line: `out_file`, `out_dir`, `chart_file`
and `default_out` for where results go, and the number types of serving/argtypes.py (re-exported).
A benchmark runs for minutes before it writes its result, so a bad `--out` (or chart, or trace
folder) is refused while the arguments are parsed; results are written whole
(serving/atomic_file.py)."""

from __future__ import annotations

import argparse
import os
import resource
from collections.abc import Callable
from pathlib import Path

from serving.argtypes import bounded_int, non_negative_int, positive_float, positive_int
from serving.atomic_file import temporary_path

__all__ = [
    "bounded_int",
    "chart_file",
    "default_out",
    "non_negative_int",
    "open_files_count",
    "out_dir",
    "out_file",
    "positive_float",
    "positive_int",
]

# The committed results: benchmarks/results/<name>.json.
RESULTS = Path(__file__).resolve().parent / "results"

# Open files a server process keeps for itself (listening socket, database, logs, pipes).
SPARE_FILES = 64


def default_out(name: str) -> str:
    """The default `--out` of benchmark ``name``: its file in benchmarks/results. Anchored at this
    folder, not the working directory (run from elsewhere, a relative default made a stray
    benchmarks/results/ there), and a string, because argparse passes only a string default through
    ``type``: a Path default skipped out_file, and a bad one was found after the run."""
    return str(RESULTS / f"{name}.json")


def out_file(text: str) -> Path:
    """argparse type of `--out PATH` / `--html PATH`: a file whose directory exists or can be created."""
    path = Path(text)
    if not text.strip() or not path.name:
        raise argparse.ArgumentTypeError(f"{text!r} is not a file path")
    # Path() drops a final "/" or "/.": "results/new/" was written as the file results/new, and
    # "x/.." was a rename over a directory that failed after the run.
    if os.path.basename(text) in ("", ".", ".."):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder path, not a file path")
    try:  # Path.exists() raises for a name over NAME_MAX ("File name too long")
        # The result is renamed over the path: a symbolic link (results/latest.json) was replaced by
        # a file and its target left as it was. Its target is the file meant.
        if path.is_symlink():
            path = Path(os.path.realpath(path))
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} is a directory, not a file path")
        # The result is renamed over the path (serving.atomic_file): a FIFO given as --out became a
        # regular file, and root's --out /dev/null would replace the device the same way.
        if path.exists() and not path.is_file():
            raise argparse.ArgumentTypeError(f"{text!r} exists and is not a regular file")
        # The directory is created at the end if missing; its nearest existing ancestor must allow it.
        existing = next(d for d in path.parents if d.exists())
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc.strerror or exc}") from None
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: {existing} is not a directory")
    _probe_write(text, existing / temporary_path(path).name)
    return path


def _probe_write(text: str, probe: Path) -> None:
    """Create and remove the file ``probe``, or name ``text`` as a path nothing can be written to.
    os.access() said yes to root for /proc and /sys, which refuse new files, and knew nothing of a
    name's length: both failed only after the run."""
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r}: cannot create a file in {probe.parent}: {exc.strerror or exc}"
        ) from None
    probe.unlink()


def chart_file(parser: argparse.ArgumentParser, out: Path, html: Path | None) -> Path:
    """The path of a benchmark's chart: ``--html``, else ``--out`` with ``.html``. Called right after
    parsing, so that a default the parser never saw is checked like ``--out``, and a chart that
    would be written over the JSON result (``--out r.html``, or ``--html`` the same file as
    ``--out``) is refused before the run rather than replacing its result at the end."""
    flag = "--html" if html is not None else "--html (default: --out with .html)"
    path = html if html is not None else out.with_suffix(".html")
    if html is None:
        try:
            out_file(str(path))
        except argparse.ArgumentTypeError as exc:
            parser.error(f"argument {flag}: {exc}")
    if path.resolve() == out.resolve():
        parser.error(f"argument {flag}: {str(path)!r} is the --out file: the chart would replace the result")
    return path


def out_dir(text: str) -> Path:
    """argparse type of a folder a benchmark writes into (created if missing): not blank, which
    Path("") would make the current directory, and not an existing file."""
    path = Path(text)
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not a folder path")
    try:
        if path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder")
        existing = next(d for d in (path, *path.parents) if d.exists())
    except OSError as exc:  # a name over NAME_MAX ("File name too long")
        raise argparse.ArgumentTypeError(f"{text!r}: {exc.strerror or exc}") from None
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: {existing} is not a directory")
    # The folder itself if it exists, else where it will be made: a folder nobody may write in
    # (--traces /proc/self, or / as a user) was taken, and the engines failed on their first trace.
    _probe_write(text, existing / f".{path.name or 'folder'}.{os.getpid()}.probe")
    return path


def open_files_count(what: str, sockets_each: int) -> Callable[[str], int]:
    """argparse type of a count of ``what`` (streams, clients) of which a server process holds
    ``sockets_each`` sockets each: a positive integer within the open-file limit (ulimit -n). Any
    count was accepted, and the benchmarks start them only after minutes of set-up or of another
    measurement; one past the limit then meets 'Too many open files' instead of a measurement."""

    def parse(text: str) -> int:
        value = positive_int(text)
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit == resource.RLIM_INFINITY:
            return value
        most = (limit - SPARE_FILES) // sockets_each
        if value > most:
            raise argparse.ArgumentTypeError(
                f"{text!r} is more than {most} {what}: the server holds {sockets_each} socket(s) for each"
                f" and may open {limit} files (ulimit -n)"
            )
        return value

    return parse
