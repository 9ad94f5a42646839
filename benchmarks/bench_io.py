"""What the benchmark scripts share on their command line: checked argument types and atomic output.

A benchmark runs for minutes before it writes its result, so a bad `--out` is refused while the
arguments are parsed, and a result file is written to a temporary file beside it and renamed over
it: an interrupted or failed write never leaves a truncated result behind.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path


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


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < math.inf:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive finite number")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0 (seeds: numpy refuses negative ones)."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= {low}")
    return value
