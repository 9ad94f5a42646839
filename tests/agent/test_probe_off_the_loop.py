"""A probe's CPU-heavy parts (drawing every prompt's token ids before the replay, and the cost-model
samples after it) run in a worker thread, not on the agent's event loop, where they paused its
heartbeats, statuses and commands (measured, 1,000 prompt and 200 output tokens a request: 2,000
requests 0.9 s drawing prompts then 1.0 s of samples; 5,000 requests 2.0 s then 3.8 s, past the
2.5 s without a heartbeat after which the control plane calls the host stale and the gateway stops
routing to every engine on it)."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path
from typing import Any

import pytest

import gpu_agent.probe as probe_module
from gpu_agent.probe import ProbeRunner
from tests.planning.test_probe_runner import engine, probe  # noqa: F401 (a fixture)
from tests.planning.test_probe_runner import spec as probe_spec


def test_prompts_and_samples_are_computed_off_the_event_loop(
    engine: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads: dict[str, threading.Thread] = {}

    def recorded(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            threads[name] = threading.current_thread()
            return fn(*args, **kwargs)

        return wrapper

    for name in ("draw_prompts", "prefill_samples", "decode_samples"):
        monkeypatch.setattr(probe_module, name, recorded(name, getattr(probe_module, name)))

    async def replay() -> Any:
        loop_thread = threading.current_thread()
        report = await ProbeRunner(engine, probe_spec(tmp_path), sample_interval_s=0.02).run(
            probe((0.0, 20, 3), (0.1, 30, 3))
        )
        return loop_thread, report

    loop_thread, report = asyncio.run(replay())
    assert report.ok, report.error
    assert set(threads) == {"draw_prompts", "prefill_samples", "decode_samples"}
    assert all(t is not loop_thread for t in threads.values()), threads


def test_draw_prompts_is_seeded_like_the_replay_was() -> None:
    from gpu_agent.probe import _Track
    from gpu_agent.protocol import ProbeRequestSpec

    tracks = [_Track(ProbeRequestSpec(0.0, 3, 1)), _Track(ProbeRequestSpec(0.1, 2, 1))]
    rng = random.Random(7)
    expected = [[rng.randrange(10, 100) for _ in range(3)], [rng.randrange(10, 100) for _ in range(2)]]
    assert probe_module.draw_prompts(tracks, random.Random(7), 10, 100) == expected
