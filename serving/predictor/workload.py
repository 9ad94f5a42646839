"""Workloads whose requests carry prompts, so a response-length predictor can be applied.

`prompt_workload` draws Poisson arrivals (serving.workload.arrivals) and gives the k-th request the
k-th prompt of a seeded corpus (serving.predictor.corpus): for one seed, requests at different rates
have the same prompts and lengths, so rates can be compared request for request.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from serving.predictor.corpus import PromptSample, make_corpus
from serving.predictor.model import LengthPredictor
from serving.workload.arrivals import poisson_arrivals
from serving.workload.request import Request


@dataclass(frozen=True)
class PromptWorkload:
    """Requests and the prompts behind them.

    Attributes:
        requests: Sorted by arrival, req_ids 0..n-1.
        samples: samples[i] is the prompt of requests[i].
    """

    requests: list[Request]
    samples: list[PromptSample]

    def predictions(self, predictor: LengthPredictor) -> dict[int, int]:
        """req_id -> predicted output tokens."""
        pred = predictor.predict([s.text for s in self.samples])
        return {r.req_id: int(p) for r, p in zip(self.requests, pred.tolist(), strict=True)}


def arrival_seed(seed: int) -> np.random.SeedSequence:
    """The seed of `prompt_workload`'s arrivals: SeedSequence(seed).spawn(1)[0].

    Not [seed, k] for any k: make_corpus seeds its i-th prompt with [seed, i], and the arrivals once
    drew from [seed, 1], the stream of prompt 1, so request 1's category, text and lengths were a
    function of the arrival times (and a change to either moved the other). A spawned child's
    entropy (seed, padding, spawn key) is no [seed, i] (and SeedSequence pads short entropy with
    zeros, so [seed, i, 0] would be [seed, i] again).
    """
    return np.random.SeedSequence(seed).spawn(1)[0]


def prompt_workload(
    rate: float, duration_s: float, seed: int = 0, corpus: list[PromptSample] | None = None
) -> PromptWorkload:
    """Poisson arrivals at `rate` over [0, duration_s), each with a corpus prompt.

    Args:
        rate: Requests per second.
        duration_s: Arrival window.
        seed: Seeds the arrivals (`arrival_seed`) and (when `corpus` is None) the corpus, from
            streams of their own: the arrivals do not depend on the prompts nor the prompts on them.
        corpus: Prompts to use in order; generated from `seed` when None. Must be long enough.
    """
    arrivals = poisson_arrivals(rate, duration_s, np.random.default_rng(arrival_seed(seed)))
    n = len(arrivals)
    samples = corpus[:n] if corpus is not None else make_corpus(n, seed=seed)
    if len(samples) < n:
        raise ValueError(f"corpus has {len(samples)} prompts, the workload needs {n}")
    requests = [
        Request(i, t, s.prompt_tokens, s.output_tokens)
        for i, (t, s) in enumerate(zip(arrivals.tolist(), samples, strict=True))
    ]
    return PromptWorkload(requests, list(samples))


def train_predictor(n: int = 4000, seed: int = 12345, alpha: float = 0.3) -> LengthPredictor:
    """A predictor fitted on a corpus drawn with a seed of its own (disjoint from workloads')."""
    train = make_corpus(n, seed=seed)
    return LengthPredictor(alpha=alpha).fit([s.text for s in train], [s.output_tokens for s in train])
