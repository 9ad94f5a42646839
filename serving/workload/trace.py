"""Trace replay from CSV.

Two layouts are recognised by their header row:
  generic   timestamp,input_tokens,output_tokens[,slo_class]
            Every row must have a finite timestamp >= 0 (seconds) and token counts >= 1.
  BurstGPT  Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
            (Wang et al., "BurstGPT: A Real-World Workload Dataset to Optimize LLM Serving
            Systems", arXiv 2401.17644; files BurstGPT_1/_2.csv; the later BurstGPT_3 layout with
            Session ID and Elapsed time columns is read the same way, by header name). Timestamps
            are seconds. Rows with 0 response tokens (failed requests) or 0 request tokens are
            SKIPPED, since they produce no work to schedule; other bad values raise as above.
The file is UTF-8, with or without a byte-order mark. Header names are matched case-insensitively
with spaces and dashes read as underscores; extra columns are ignored. Rows are ordered by
(timestamp, line) and req_ids are assigned densely in that order. Timestamps are shifted so the
first kept request arrives at 0 and then multiplied by `time_scale` (0.5 replays twice as fast).
"""

from __future__ import annotations

import csv
import math
import numbers
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from serving.workload.request import Request

if TYPE_CHECKING:
    from _csv import Reader as _CsvReader

_GENERIC = ("timestamp", "input_tokens", "output_tokens")
_BURSTGPT = ("timestamp", "request_tokens", "response_tokens")


def _norm(name: str) -> str:
    return name.strip().lower().replace(" ", "_").replace("-", "_")


def _plain(text: str) -> bool:
    """ASCII, no digit-group underscores: int() and float() also take "1_000" and "٣" (Python's
    literal syntax and other scripts' digits), which no CSV writer produces for a count."""
    return text.isascii() and "_" not in text


def _parse_int(raw: str, where: str, column: str) -> int:
    text = raw.strip()
    try:
        if not _plain(text):
            raise ValueError
        value = int(text)
    except ValueError:
        raise ValueError(f"{where}, column {column!r}: expected an integer, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{where}, column {column!r}: must be >= 0, got {value}")
    return value


def _parse_time(raw: str, where: str, column: str) -> float:
    text = raw.strip()
    try:
        if not _plain(text):
            raise ValueError
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}, column {column!r}: expected a number, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}, column {column!r}: must be a finite number >= 0, got {raw!r}")
    return value


def load_trace(
    path: str | Path,
    time_scale: float = 1.0,
    duration_s: float | None = None,
    max_requests: int | None = None,
) -> list[Request]:
    """Read a request trace (either layout above).

    Args:
        path: CSV file.
        time_scale: Multiplier applied to (shifted) arrival times, > 0.
        duration_s: Keep only requests arriving before this time (after shifting and scaling).
        max_requests: Keep at most this many requests (the earliest).

    Returns:
        Requests sorted by arrival with req_ids 0..n-1.

    Raises:
        ValueError: Missing header columns or a bad value; the message names the file, line and
            column.
    """
    if not time_scale > 0 or math.isinf(time_scale):
        raise ValueError(f"{time_scale=} must be a positive finite number")
    # A negative or NaN limit used to read as "keep nothing" / "keep everything", silently.
    if duration_s is not None and not duration_s >= 0:
        raise ValueError(f"{duration_s=} must be >= 0")
    if max_requests is not None and (
        isinstance(max_requests, bool) or not isinstance(max_requests, numbers.Integral) or max_requests < 0
    ):
        raise ValueError(f"{max_requests=} must be an integer >= 0")
    path = Path(path)
    # utf-8-sig: a spreadsheet's "CSV UTF-8" export starts with a byte-order mark, which utf-8 kept
    # in the first header name ('\ufefftimestamp'), so the header matched neither layout.
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        try:
            return _read(reader, str(path), time_scale, duration_s, max_requests)
        except csv.Error as exc:  # a field over csv.field_size_limit(), a quote left open, ...
            raise ValueError(f"{path} line {reader.line_num}: not a readable CSV row ({exc})") from None


def _read(
    reader: _CsvReader,
    name: str,
    time_scale: float,
    duration_s: float | None,
    max_requests: int | None,
) -> list[Request]:
    header = next(reader, None)
    if header is None:
        raise ValueError(f"{name} line 1: empty file, expected a header row")
    cols = [_norm(h) for h in header]
    if all(c in cols for c in _BURSTGPT):
        t_col, in_col, out_col = (cols.index(c) for c in _BURSTGPT)
        burstgpt = True
    elif all(c in cols for c in _GENERIC):
        t_col, in_col, out_col = (cols.index(c) for c in _GENERIC)
        burstgpt = False
    else:
        raise ValueError(
            f"{name} line 1: header {header!r} has neither the generic columns "
            f"{','.join(_GENERIC)} nor the BurstGPT columns Timestamp,Request tokens,Response tokens"
        )
    slo_col = cols.index("slo_class") if "slo_class" in cols else None
    names = [h.strip() for h in header]
    rows_out: list[tuple[float, int, int, int, str | None]] = []  # (t, line, prompt, output, class)
    for row in reader:
        line = reader.line_num  # physical line, correct across quoted newlines
        if not row or all(not c.strip() for c in row):
            continue
        where = f"{name} line {line}"
        if len(row) < len(header):
            raise ValueError(f"{where}: expected {len(header)} columns, got {len(row)}")
        t = _parse_time(row[t_col], where, names[t_col])
        prompt = _parse_int(row[in_col], where, names[in_col])
        output = _parse_int(row[out_col], where, names[out_col])
        if burstgpt and (prompt == 0 or output == 0):
            continue
        for col, value in ((in_col, prompt), (out_col, output)):
            if value < 1:
                raise ValueError(f"{where}, column {names[col]!r}: must be >= 1, got {value}")
        cls = (row[slo_col].strip() or None) if slo_col is not None else None
        rows_out.append((t, line, prompt, output, cls))
    rows_out.sort(key=lambda r: (r[0], r[1]))
    if not rows_out:
        return []
    t0 = rows_out[0][0]
    requests: list[Request] = []
    for t, _line, prompt, output, cls in rows_out:
        arrival = (t - t0) * time_scale
        if duration_s is not None and arrival >= duration_s:
            break
        if max_requests is not None and len(requests) >= max_requests:
            break
        requests.append(Request(len(requests), arrival, prompt, output, cls))
    return requests


def write_trace(path: str | Path, requests: Iterable[Request]) -> None:
    """Write requests in the generic layout (with slo_class), readable by `load_trace`."""
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow([*_GENERIC, "slo_class"])
        for r in requests:
            w.writerow([repr(r.arrival), r.prompt_tokens, r.output_tokens, r.slo_class or ""])
