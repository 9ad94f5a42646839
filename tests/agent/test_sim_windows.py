"""A simulated host reports every simulated second in exactly one telemetry sample, however the
ticks fall: it reported the last second's window at every tick, so a tick finding no new second
sent that window again and a tick finding two lost the first."""

from __future__ import annotations

import asyncio

from gpu_agent.protocol import EngineSample
from gpu_agent.simulated import SimulatedHost

SECONDS = 14


def started(seed: int = 4) -> SimulatedHost:
    host = SimulatedHost("2xH100", rate=8.0, seed=seed)
    asyncio.run(host.start(lambda status: None))
    return host


def counts(samples: list[list[EngineSample]]) -> dict[str, tuple[int, int]]:
    """Engine id -> (TTFT, ITL observations) summed over the samples."""
    out: dict[str, tuple[int, int]] = {}
    for engines in samples:
        for e in engines:
            assert e.ttft is not None and e.itl is not None
            ttft, itl = out.get(e.deployment_id, (0, 0))
            out[e.deployment_id] = (ttft + e.ttft.count, itl + e.itl.count)
    return out


def test_each_simulated_second_is_reported_once_whatever_the_tick_times() -> None:
    steady = started()
    reference = [steady.sample_at(float(t))[1] for t in range(1, SECONDS + 1)]

    drifting = started()
    # Ticks drifting against the simulated seconds: some find none new, some find two or three.
    ticks = [0.4, 0.9, 2.1, 2.5, 2.99, 3.0, 3.01, 5.7, 6.0, 6.2, 8.999, 9.0, 12.3, 12.4, float(SECONDS)]
    samples = [drifting.sample_at(t)[1] for t in ticks]

    expected = counts(reference)
    assert all(ttft > 0 and itl > 0 for ttft, itl in expected.values()), expected
    assert counts(samples) == expected
    # A tick that finds no new simulated second reports no latencies.
    for t, engines in zip(ticks, samples, strict=True):
        if t in (0.4, 0.9, 2.5, 2.99, 3.01, 6.2, 12.4):
            assert all(e.ttft is not None and e.ttft.count == 0 for e in engines), t


def test_a_tick_covering_several_seconds_reports_their_mean_utilisation() -> None:
    steady = started(seed=9)
    per_second = [steady.sample_at(float(t))[0][0].utilization_pct for t in range(1, 4)]
    jumping = started(seed=9)
    (device, *_), _ = jumping.sample_at(3.5)
    assert device.utilization_pct is not None
    assert abs(device.utilization_pct - sum(p or 0.0 for p in per_second) / 3) <= 0.1
    (again, *_), _ = jumping.sample_at(3.9)  # no new second: the last second's utilisation
    assert again.utilization_pct == per_second[-1]
