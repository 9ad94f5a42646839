"""Capped exponential backoff, with optional seeded jitter.

One implementation for every retry loop of the platform: the GPU agent's control-plane link,
engine and coordinator restarts (jittered, so a fleet that lost its control plane at one moment
does not come back in step), and the Aqua clients' session reopening (`jitter=False`: a plain
doubling, the same delays on every run).
"""

from __future__ import annotations

import hashlib
import math
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
    """Delays base, base*factor, base*factor^2, ... capped at `cap_s`.

    With `jitter` ("equal jitter") each delay is drawn uniformly from [d/2, d] of the nominal
    delay d, so many clients failing together spread out while no delay is shorter than half the
    nominal one (never a hot loop). Without it the delays are the nominal ones.

    Attributes:
        base_s: First nominal delay (seconds).
        cap_s: Largest nominal delay.
        factor: Growth per attempt.
        seed: Seed of the jitter RNG (deterministic runs); unused without jitter.
        jitter: Draw each delay from [d/2, d] instead of returning d.
        attempts: Failures counted since the last `reset()`.
    """

    base_s: float = 0.5
    cap_s: float = 30.0
    factor: float = 2.0
    seed: int = 0
    jitter: bool = True
    attempts: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not (self.base_s > 0 and math.isfinite(self.base_s)):  # also refuses nan
            raise ValueError(f"{self.base_s=} must be positive and finite")
        if not (self.cap_s >= self.base_s and math.isfinite(self.cap_s)):
            raise ValueError(f"{self.cap_s=} must be finite and >= base_s ({self.base_s})")
        if not (self.factor >= 1 and math.isfinite(self.factor)):
            raise ValueError(f"{self.factor=} must be finite and >= 1")
        self._rng = random.Random(self.seed)

    def next_delay(self) -> float:
        """The delay before the next attempt; each call counts one more failure."""
        try:
            nominal = min(self.cap_s, self.base_s * self.factor ** min(self.attempts, 64))
        except OverflowError:  # a huge factor: long past the cap
            nominal = self.cap_s
        self.attempts += 1
        if not self.jitter:
            return nominal
        return nominal / 2 + self._rng.uniform(0, nominal / 2)

    def reset(self) -> None:
        """Back to `base_s` after a success."""
        self.attempts = 0
