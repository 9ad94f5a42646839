"""argparse types for numbers, shared by the serving CLIs and the benchmark scripts: a bad value is
an argparse error naming it (exit status 2), never a traceback or a NaN that runs on."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _parse(text: str, kind: type[int] | type[float]) -> float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid {kind.__name__}") from None


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = int(_parse(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (seeds: numpy refuses negative ones)."""
    value = int(_parse(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """The type of an integer in ``low..high``: an absurd count (10**30 rounds, GPUs) would
    otherwise be taken and crash or run for ever later."""

    def parse(text: str) -> int:
        value = int(_parse(text, int))
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} must be in {low}..{high}")
        return value

    parse.__name__ = f"int_{low}_to_{high}"
    return parse


def bounded_float(low: float, high: float) -> Callable[[str], float]:
    """The type of a number in ``low..high`` (refuses nan): a limit in seconds of 1e29 would
    otherwise be taken as no limit at all."""

    def parse(text: str) -> float:
        value = _parse(text, float)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} must be in {low:g}..{high:g}")
        return value

    parse.__name__ = f"float_{low:g}_to_{high:g}"
    return parse


def positive_float(text: str) -> float:
    """A finite number > 0 (refuses nan and inf)."""
    value = _parse(text, float)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive finite number")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (refuses nan and inf)."""
    value = _parse(text, float)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0 and finite")
    return value
