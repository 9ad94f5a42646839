"""Prompt/output length distributions: clamped, rounded lognormals fitted to summary statistics.

A lognormal is pinned by two figures. Given a mean m and a median d (m > d):
    mu = ln d,   sigma = sqrt(2 ln(m / d))
Given a mean m and a coefficient of variation v:
    sigma^2 = ln(1 + v^2),   mu = ln m - sigma^2 / 2
Samples are rounded to integers and clamped to [min_tokens, max_tokens]; the clamp shifts the mean a
little for heavy tails (documented per dataset in `datasets.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class LogNormalLength:
    """A token-count distribution: round(exp(N(mu, sigma^2))) clamped to [min_tokens, max_tokens].

    Attributes:
        mu: Mean of the underlying normal (log tokens).
        sigma: Standard deviation of the underlying normal; 0 gives a constant length.
        min_tokens: Smallest length produced, >= 1.
        max_tokens: Largest length produced.
    """

    mu: float
    sigma: float
    min_tokens: int = 1
    max_tokens: int = 1 << 20

    def __post_init__(self) -> None:
        if not math.isfinite(self.mu):
            raise ValueError(f"{self.mu=} must be finite")
        if not self.sigma >= 0 or not math.isfinite(self.sigma):
            raise ValueError(f"{self.sigma=} must be >= 0 and finite")
        if self.min_tokens < 1:
            raise ValueError(f"{self.min_tokens=} must be >= 1")
        if self.max_tokens < self.min_tokens:
            raise ValueError(f"{self.max_tokens=} must be >= {self.min_tokens=}")

    @classmethod
    def from_mean_median(
        cls, mean: float, median: float, min_tokens: int = 1, max_tokens: int = 1 << 20
    ) -> LogNormalLength:
        """The lognormal with this mean and median (requires mean > median > 0)."""
        if not mean > median > 0:
            raise ValueError(f"need mean > median > 0, got {mean=}, {median=}")
        return cls(math.log(median), math.sqrt(2 * math.log(mean / median)), min_tokens, max_tokens)

    @classmethod
    def from_mean_cv(
        cls, mean: float, cv: float, min_tokens: int = 1, max_tokens: int = 1 << 20
    ) -> LogNormalLength:
        """The lognormal with this mean and coefficient of variation (std / mean)."""
        if not mean > 0:
            raise ValueError(f"{mean=} must be positive")
        if not cv >= 0:
            raise ValueError(f"{cv=} must be >= 0")
        s2 = math.log1p(cv * cv)
        return cls(math.log(mean) - s2 / 2, math.sqrt(s2), min_tokens, max_tokens)

    @property
    def mean(self) -> float:
        """Mean of the unclamped, unrounded distribution."""
        return math.exp(self.mu + self.sigma**2 / 2)

    @property
    def median(self) -> float:
        """Median of the unclamped, unrounded distribution."""
        return math.exp(self.mu)

    def sample(self, n: int, rng: np.random.Generator, max_tokens: int | None = None) -> np.ndarray:
        """`n` integer lengths (int64), clamped to [min_tokens, min(max_tokens, self.max_tokens)]."""
        return self.from_normal(rng.standard_normal(n), max_tokens)

    def from_normal(self, z: np.ndarray, max_tokens: int | None = None) -> np.ndarray:
        """Lengths from standard-normal draws `z` (one per length), clamped as in `sample`."""
        hi = self.max_tokens if max_tokens is None else min(max_tokens, self.max_tokens)
        lo = min(self.min_tokens, hi)
        raw = np.exp(self.mu + self.sigma * z)
        return np.clip(np.rint(raw), lo, hi).astype(np.int64)


@dataclass(frozen=True, slots=True)
class LengthDistribution:
    """Joint prompt/output lengths of one dataset (prompt and output drawn independently).

    Attributes:
        name: Registry key, e.g. "sharegpt".
        prompt: Prompt-length distribution.
        output: Output-length distribution.
        max_context: Default cap on prompt + output tokens (the model's context window).
        source: Where the fitted figures come from (paper, table/figure).
    """

    name: str
    prompt: LogNormalLength
    output: LogNormalLength
    max_context: int
    source: str = ""

    def __post_init__(self) -> None:
        if self.max_context < 2:
            raise ValueError(f"{self.max_context=} must be >= 2 (one prompt and one output token)")

    def sample(
        self, n: int, rng: np.random.Generator, max_context: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Draw `n` (prompt, output) length pairs.

        The output is clamped to max_context - 1 and then the prompt to max_context - output, so
        every request fits in the context window; a too-long prompt is truncated to leave room
        for its answer (as LongBench does when a document exceeds the model's window).

        Returns:
            Two int64 arrays of length n: prompt tokens and output tokens.
        """
        ctx = self.max_context if max_context is None else max_context
        if ctx < 2:
            raise ValueError(f"{max_context=} must be >= 2")
        # One (prompt, output) pair of normals per request, so the first k requests are the same
        # whatever n is (workloads of different lengths or arrival processes share a prefix).
        z = rng.standard_normal((n, 2))
        prompts = self.prompt.from_normal(z[:, 0])
        outputs = self.output.from_normal(z[:, 1], max_tokens=ctx - 1)
        prompts = np.minimum(prompts, ctx - outputs)
        return prompts, outputs
