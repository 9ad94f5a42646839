"""EcoServe and a request's `max_output_tokens` (a `SchedRequest` property): a prediction above it
counts as that many tokens; a request without a cap (None, as every simulated one) is uncapped."""

from __future__ import annotations

from dataclasses import dataclass

from serving.policies.ecoserve import EcoServePolicy
from serving.sim.state import SimRequest
from serving.workload.request import Request

EDGES = (0, 16, 32, 64)  # bucket tops: 16, 32, 64, then doubling (128 ...)


@dataclass(frozen=True)
class Req:
    predicted_output_tokens: int | None = None
    max_output_tokens: int | None = None
    req_id: str = "r"
    arrival_time: float = 0.0
    num_prompt_tokens: int = 8
    num_computed_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    admission_seq: int = 0
    num_preemptions: int = 0
    slo_class: str | None = None


def test_it_reads_a_prediction_above_max_output_tokens_as_max_output_tokens() -> None:
    policy = EcoServePolicy(bucket_edges=EDGES)
    assert policy.predicted_output(Req(predicted_output_tokens=10**9, max_output_tokens=20)) == 32
    assert policy.predicted_output(Req(predicted_output_tokens=12, max_output_tokens=20)) == 16
    with_default = EcoServePolicy(bucket_edges=EDGES, default_prediction=1000)
    assert with_default.predicted_output(Req(max_output_tokens=20)) == 32


def test_it_leaves_a_request_without_a_cap_uncapped() -> None:
    policy = EcoServePolicy(bucket_edges=EDGES)
    assert policy.predicted_output(Req(predicted_output_tokens=100)) == 128
    simulated = SimRequest(Request(0, 0.0, 8, 5), predicted_output_tokens=100)
    assert simulated.max_output_tokens is None
    assert policy.predicted_output(simulated) == 128  # its true length (5) is no cap


def test_a_prediction_of_zero_tokens_is_a_prediction_not_a_missing_one() -> None:
    # `predicted_output_tokens or default_prediction` read a 0 prediction (a simulator's predictions
    # map may hold one) as none: it reserved the default (1,024 tokens here) for a request predicted
    # to end at once, and without a default only what it held, where a 1-token prediction reserves
    # its bucket's top.
    with_default = EcoServePolicy(bucket_edges=EDGES, default_prediction=1000)
    assert with_default.predicted_output(Req(predicted_output_tokens=0)) == 16
    assert with_default.predicted_output(Req()) == 1024
    policy = EcoServePolicy(bucket_edges=EDGES)
    assert policy.predicted_output(Req(predicted_output_tokens=0)) == policy.predicted_output(
        Req(predicted_output_tokens=1)
    )
