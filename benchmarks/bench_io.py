"""What the benchmark scripts share on their command line: `out_file`, and the number types of
serving/argtypes.py (re-exported). A benchmark runs for minutes before it writes its result, so a
bad `--out` is refused while the arguments are parsed; results are written whole
(serving/atomic_file.py)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from serving.argtypes import non_negative_int, positive_float, positive_int

__all__ = ["non_negative_int", "out_file", "positive_float", "positive_int"]


def out_file(text: str) -> Path:
    """argparse type of `--out PATH` / `--html PATH`: a file whose directory exists or can be created."""
    path = Path(text)
    if not text.strip() or not path.name:
        raise argparse.ArgumentTypeError(f"{text!r} is not a file path")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, not a file path")
    # The directory is created at the end if missing; its nearest existing ancestor must allow it.
    existing = next(d for d in path.parents if d.exists())
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: {existing} is not writable")
    return path
