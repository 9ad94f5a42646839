"""Offload counters, published as a small JSON file that tests, benchmarks and the agent scrape."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class OffloadStats:
    """Cumulative worker-side counters (bytes and seconds are totals since engine start)."""

    saves: int = 0
    loads: int = 0
    bytes_offloaded: int = 0
    bytes_restored: int = 0
    save_seconds: float = 0.0
    load_seconds: float = 0.0
    save_failures: int = 0
    load_failures: int = 0
    evacuations: int = 0
    bytes_evacuated: int = 0
    corrupted_restores: int = 0
    saves_by_tier: dict[str, int] = field(default_factory=dict)
    loads_by_tier: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def write_json_atomic(path: str | Path, data: dict[str, Any]) -> None:
    """Write `data` to `path` so that a reader never sees a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)


def read_json(path: str | Path) -> dict[str, Any]:
    """Read a counters file; a missing file reads as {}."""
    try:
        return dict(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        return {}
