"""An interactive, self-contained plotly HTML report of one simulated run.

Four panels: TTFT over time (by arrival), time between tokens over time (by emission), and the
distributions of both. Large runs are summarised per time bin (p50 and p99 lines) and as histograms
so the file stays small whatever the number of requests; plotly.js is embedded so the file opens
offline.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from serving.metrics.records import RequestRecord

MAX_POINTS = 5000  # above this, per-bin percentiles replace the scatter
NUM_BINS = 200


def _ttft_series(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    done = [r for r in records if r.token_times]
    t = np.fromiter((r.arrival for r in done), float, len(done))
    v = np.fromiter((r.token_times[0] - r.arrival for r in done), float, len(done))
    return t, v


def _tbt_series(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    times = [np.asarray(r.token_times, float) for r in records if len(r.token_times) > 1]
    if not times:
        return np.empty(0), np.empty(0)
    return np.concatenate([x[1:] for x in times]), np.concatenate([np.diff(x) for x in times])


def binned_percentiles(t: np.ndarray, v: np.ndarray, bins: int = NUM_BINS) -> dict[str, np.ndarray]:
    """Per time bin: bin centre, p50 and p99 of the values (empty bins are dropped)."""
    order = np.argsort(t, kind="stable")
    t, v = t[order], v[order]
    edges = np.linspace(t[0], t[-1], bins + 1) if len(t) else np.zeros(1)
    cut = np.searchsorted(t, edges[1:-1], side="left")
    centre, p50, p99 = [], [], []
    for k, chunk in enumerate(np.split(v, cut)):
        if len(chunk):
            centre.append((edges[k] + edges[k + 1]) / 2)
            p50.append(np.percentile(chunk, 50))
            p99.append(np.percentile(chunk, 99))
    return {"t": np.array(centre), "p50": np.array(p50), "p99": np.array(p99)}


def _over_time(fig: go.Figure, t: np.ndarray, v_ms: np.ndarray, name: str, row: int) -> None:
    if len(t) == 0:
        return
    if len(t) <= MAX_POINTS:
        points = go.Scattergl(x=t, y=v_ms, mode="markers", name=name, marker={"size": 4})
        fig.add_trace(points, row=row, col=1)
        return
    b = binned_percentiles(t, v_ms)
    fig.add_trace(go.Scatter(x=b["t"], y=b["p50"], mode="lines", name=f"{name} p50"), row=row, col=1)
    fig.add_trace(go.Scatter(x=b["t"], y=b["p99"], mode="lines", name=f"{name} p99"), row=row, col=1)


def _histogram(fig: go.Figure, v_ms: np.ndarray, name: str, row: int) -> None:
    if len(v_ms) == 0:
        return
    # Pre-binned (not go.Histogram over raw samples) so millions of gaps do not bloat the file.
    top = float(np.percentile(v_ms, 99.9))
    counts, edges = np.histogram(np.minimum(v_ms, top), bins=100, range=(0.0, max(top, 1e-9)))
    fig.add_trace(
        go.Bar(x=(edges[:-1] + edges[1:]) / 2, y=counts, name=f"{name} count", width=edges[1] - edges[0]),
        row=row,
        col=2,
    )


def build_figure(records: Sequence[RequestRecord], title: str) -> go.Figure:
    """The report's figure (see the module docstring)."""
    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=(
            "TTFT by arrival time",
            "TTFT distribution",
            "Time between tokens by emission time",
            "Time-between-tokens distribution (top 0.1% in the last bar)",
        ),
    )
    t, v = _ttft_series(records)
    _over_time(fig, t, v * 1e3, "TTFT", 1)
    _histogram(fig, v * 1e3, "TTFT", 1)
    t, v = _tbt_series(records)
    _over_time(fig, t, v * 1e3, "TBT", 2)
    _histogram(fig, v * 1e3, "TBT", 2)
    for row in (1, 2):
        fig.update_xaxes(title_text="simulated time (s)", row=row, col=1)
        fig.update_yaxes(title_text="ms", row=row, col=1)
        fig.update_xaxes(title_text="ms", row=row, col=2)
        fig.update_yaxes(title_text="count", row=row, col=2)
    fig.update_layout(title=title, height=800, template="plotly_white")
    return fig


def render_report(records: Sequence[RequestRecord], title: str) -> str:
    """The HTML report (plotly.js embedded, works offline)."""
    return str(build_figure(records, title).to_html(include_plotlyjs=True, full_html=True))
