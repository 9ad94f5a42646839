"""A ridge regression from prompt features to response length, with bucketed predictions.

The target is log(1 + output tokens): response lengths are long-tailed, and a least-squares fit in
log space predicts something close to the conditional median, which is what minimises absolute
error. Ridge (L2) regularisation keeps the hashed bag-of-words weights small; the intercept is not
penalised. Solved in closed form with numpy on centred features (which leaves the intercept out of
the penalty): w = (Xc'Xc + alpha * I) ^ -1 Xc'yc, by least squares (SVD), so that any positive
finite alpha fits: with alpha below rounding (1e-300) the matrix is singular wherever hashed
columns coincide, and `np.linalg.solve` raised LinAlgError; least squares then gives the
minimum-norm fit, the limit of ridge as alpha goes to 0.

Predictions are capped at `max_prediction` tokens (default 2^20, the longest length any
serving/workload distribution draws): a prompt far outside the training data (a 50-digit
"length request") extrapolates to exp(hundreds), which as int64 wrapped to a NEGATIVE length in
bucket 0, the shortest.

Buckets are half-open token ranges [edge_k, edge_k+1); EcoServe batches generation tasks by the
bucket of their predicted length.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from serving.predictor.features import DEFAULT_HASH_DIM, featurize

DEFAULT_BUCKET_EDGES: tuple[int, ...] = (0, 64, 128, 256, 512, 1024)
DEFAULT_MAX_PREDICTION = 1 << 20


def bucket_of(tokens: float, edges: Sequence[int] = DEFAULT_BUCKET_EDGES) -> int:
    """Index k of the bucket [edges[k], edges[k+1]) holding `tokens` (the last bucket is open)."""
    return max(0, bisect.bisect_right(edges, tokens) - 1)


@dataclass(frozen=True, slots=True)
class PredictorReport:
    """Held-out error of a predictor.

    Attributes:
        mae: Mean absolute error of the predicted output tokens.
        mean_baseline_mae: MAE of always predicting the training mean.
        bucket_accuracy: Fraction of samples whose predicted bucket is their true bucket.
        within_one_bucket: Fraction whose predicted bucket is at most one away.
        samples: Held-out samples evaluated.
    """

    mae: float
    mean_baseline_mae: float
    bucket_accuracy: float
    within_one_bucket: float
    samples: int


def _lengths(texts: Sequence[str], output_tokens: Sequence[int]) -> np.ndarray:
    """`output_tokens` as floats, checked: one finite length >= 1 per prompt, at least one."""
    if len(texts) != len(output_tokens) or not texts:
        raise ValueError("need as many output lengths as prompts, at least one")
    y = np.asarray(output_tokens, dtype=float)
    if not np.all(np.isfinite(y) & (y >= 1)):
        raise ValueError("output lengths must be finite and >= 1")
    return y


def _ridge(x: np.ndarray, t: np.ndarray, alpha: float) -> np.ndarray:
    """Weights w minimising |x w - t|^2 + alpha |w[1:]|^2 (column 0 of x is the intercept, 1s).

    Centring the other columns and `t` takes the unpenalised intercept out of the system; the rest
    is solved by least squares, whose SVD drops directions that `alpha` is too small to lift above
    rounding (where `np.linalg.solve` raised on a singular matrix) and keeps the solution finite.
    """
    mean_x = x[:, 1:].mean(axis=0)
    mean_t = float(t.mean())
    xc = x[:, 1:] - mean_x
    gram = xc.T @ xc + alpha * np.eye(xc.shape[1])
    w = np.linalg.lstsq(gram, xc.T @ (t - mean_t), rcond=None)[0]
    return np.concatenate([[mean_t - float(mean_x @ w)], w])


class LengthPredictor:
    """Predicts a prompt's response length (tokens) from its text."""

    def __init__(
        self,
        alpha: float = 0.3,
        hash_dim: int = DEFAULT_HASH_DIM,
        bucket_edges: Sequence[int] = DEFAULT_BUCKET_EDGES,
        max_prediction: int = DEFAULT_MAX_PREDICTION,
    ) -> None:
        if not 0 < alpha < math.inf:
            raise ValueError(f"{alpha=} must be positive and finite")
        if hash_dim < 1:
            raise ValueError(f"{hash_dim=} must be positive")
        if not 1 <= max_prediction <= 1 << 53:
            raise ValueError(f"{max_prediction=} must be in 1..2**53")
        if list(bucket_edges) != sorted(set(bucket_edges)) or not bucket_edges or bucket_edges[0] != 0:
            raise ValueError(f"{bucket_edges=} must be strictly increasing and start at 0")
        self.alpha = alpha
        self.hash_dim = hash_dim
        self.bucket_edges = tuple(bucket_edges)
        self.max_prediction = max_prediction
        self.weights: np.ndarray | None = None
        self.train_mean = 0.0

    def fit(self, texts: Sequence[str], output_tokens: Sequence[int]) -> LengthPredictor:
        """Fit on prompts and their response lengths; returns self."""
        y = _lengths(texts, output_tokens)
        self.weights = _ridge(featurize(texts, self.hash_dim), np.log1p(y), self.alpha)
        self.train_mean = float(y.mean())
        return self

    def predict(self, texts: Sequence[str]) -> np.ndarray:
        """Predicted response lengths (int64 tokens in 1..max_prediction), one per prompt."""
        if self.weights is None:
            raise RuntimeError("predict() before fit()")
        # Clipped in log space, before expm1 can overflow to inf.
        log_len = np.minimum(featurize(texts, self.hash_dim) @ self.weights, math.log1p(self.max_prediction))
        return np.clip(np.rint(np.expm1(log_len)), 1, self.max_prediction).astype(np.int64)

    def predict_buckets(self, texts: Sequence[str]) -> list[int]:
        """Bucket index of each predicted length (see `bucket_of`)."""
        return [bucket_of(float(v), self.bucket_edges) for v in self.predict(texts)]

    def evaluate(self, texts: Sequence[str], output_tokens: Sequence[int]) -> PredictorReport:
        """Error on held-out prompts against the truth and against predicting the training mean."""
        y = _lengths(texts, output_tokens)
        pred = self.predict(texts).astype(float)
        true_b = np.array([bucket_of(v, self.bucket_edges) for v in y])
        pred_b = np.array([bucket_of(v, self.bucket_edges) for v in pred])
        return PredictorReport(
            mae=float(np.mean(np.abs(pred - y))),
            mean_baseline_mae=float(np.mean(np.abs(self.train_mean - y))),
            bucket_accuracy=float(np.mean(true_b == pred_b)),
            within_one_bucket=float(np.mean(np.abs(true_b - pred_b) <= 1)),
            samples=len(y),
        )
