"""Capped exponential backoff with seeded jitter, shared by the link and engine supervision."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field


def seed_for(name: str) -> int:
    """A jitter seed derived from `name` (e.g. the host name).

    Every agent of a fleet loses the control plane at the same moment when it restarts; with one
    shared seed their "random" delays would be the same numbers and they would all reconnect in
    step. A seed from the host's (unique) name spreads them while keeping one host's delays
    reproducible. A stable hash, not `hash()`, which changes with every process.
    """
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big")


@dataclass
class Backoff:
    """Delays base, base*factor, base*factor^2, ... capped at `cap_s`, with "equal jitter":
    each delay is drawn uniformly from [d/2, d], so many agents restarting together spread out
    while no delay is shorter than half the nominal one (never a hot loop).

    Attributes:
        base_s: First nominal delay (seconds).
        cap_s: Largest nominal delay.
        factor: Growth per attempt.
        seed: Seed of the jitter RNG (deterministic runs).
    """

    base_s: float = 0.5
    cap_s: float = 30.0
    factor: float = 2.0
    seed: int = 0
    attempts: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.base_s <= 0:
            raise ValueError(f"{self.base_s=} must be positive")
        if self.cap_s < self.base_s:
            raise ValueError(f"{self.cap_s=} must be >= base_s")
        if self.factor < 1:
            raise ValueError(f"{self.factor=} must be >= 1")
        self._rng = random.Random(self.seed)

    def next_delay(self) -> float:
        """The delay before the next attempt; each call counts one more failure."""
        nominal = min(self.cap_s, self.base_s * self.factor ** min(self.attempts, 64))
        self.attempts += 1
        return nominal / 2 + self._rng.uniform(0, nominal / 2)

    def reset(self) -> None:
        """Back to `base_s` after a success."""
        self.attempts = 0
