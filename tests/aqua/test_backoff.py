"""`serving.backoff.Backoff`: the one backoff of the agent (jittered) and of the Aqua clients'
session reopening (a plain doubling)."""

from __future__ import annotations

import os
import tempfile
import time

import pytest

from serving.aqua.coordinator.session import CoordinatorSession
from serving.backoff import Backoff, seed_for


def test_it_doubles_up_to_the_cap_without_jitter_and_starts_over_after_a_reset() -> None:
    b = Backoff(base_s=0.25, cap_s=5.0, jitter=False)
    assert [b.next_delay() for _ in range(7)] == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    b.reset()
    assert b.next_delay() == 0.25


def test_its_jitter_stays_within_half_to_all_of_each_delay_and_is_seeded() -> None:
    a, b, other = Backoff(1.0, 8.0, seed=7), Backoff(1.0, 8.0, seed=7), Backoff(1.0, 8.0, seed=8)
    delays = [a.next_delay() for _ in range(6)]
    for delay, nominal in zip(delays, [1, 2, 4, 8, 8, 8], strict=True):
        assert nominal / 2 <= delay <= nominal
    assert delays == [b.next_delay() for _ in range(6)]
    assert delays != [other.next_delay() for _ in range(6)]
    assert seed_for("host-a") == seed_for("host-a") != seed_for("host-b")


def test_a_huge_factor_stays_at_the_cap() -> None:
    b = Backoff(base_s=1.0, cap_s=10.0, factor=1e300, jitter=False)
    assert [b.next_delay() for _ in range(4)] == [1.0, 10.0, 10.0, 10.0]


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"base_s": 0}, "base_s"),
        ({"base_s": float("nan")}, "base_s"),
        ({"base_s": 2.0, "cap_s": 1.0}, "cap_s"),
        ({"cap_s": float("inf")}, "cap_s"),
        ({"factor": 0.5}, "factor"),
    ],
)
def test_it_refuses_bad_settings_naming_them(kwargs: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        Backoff(**kwargs)  # type: ignore[arg-type]


def test_the_coordinator_session_retries_at_the_doubling_delays() -> None:
    with tempfile.TemporaryDirectory(prefix="aqua-") as d:
        session = CoordinatorSession(os.path.join(d, "nobody.sock"), retry_base_s=0.1, retry_cap_s=0.3)
        waits = []
        for _ in range(4):
            t0 = time.monotonic()
            assert session.ensure() is None
            waits.append(session._next_try - t0)
            assert session.ensure() is None and session._next_try - t0 == pytest.approx(
                waits[-1]
            )  # no retry yet
            session._next_try = 0.0  # as if the wait were over
        assert waits == pytest.approx([0.1, 0.2, 0.3, 0.3], abs=0.05)
    with pytest.raises(ValueError, match="retry_base_s"):
        CoordinatorSession("x.sock", retry_base_s=2.0, retry_cap_s=1.0)
