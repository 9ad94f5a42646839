"""EcoServe and a request's `max_output_tokens` (a `SchedRequest` property): a prediction above it
counts as that many tokens and no reservation exceeds it; a request without a cap (None, as every
simulated one) is uncapped."""

from __future__ import annotations

from dataclasses import dataclass, replace

from serving.policies.base import SchedContext
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
    assert policy.predicted_output(Req(predicted_output_tokens=10**9, max_output_tokens=20)) == 20
    assert policy.predicted_output(Req(predicted_output_tokens=12, max_output_tokens=20)) == 16
    with_default = EcoServePolicy(bucket_edges=EDGES, default_prediction=1000)
    assert with_default.predicted_output(Req(max_output_tokens=20)) == 20


def test_no_reservation_exceeds_what_the_request_can_generate() -> None:
    # The prediction was capped at max_output_tokens, then rounded up to its bucket's top: a request
    # allowed 20 tokens (bucket 16..31) reserved 32, one allowed 100 (bucket 64+) reserved 128, KV
    # no such request fills, which held other requests back.
    policy = EcoServePolicy(bucket_edges=EDGES)
    assert policy.predicted_output(Req(predicted_output_tokens=18, max_output_tokens=20)) == 20
    assert policy.predicted_output(Req(predicted_output_tokens=90, max_output_tokens=100)) == 100
    # One that outlives its bucket still reserves no more than its cap (and always its next token).
    outlived = Req(predicted_output_tokens=5, max_output_tokens=20, num_output_tokens=17)
    assert policy.predicted_output(outlived) == 20
    assert policy.predicted_output(replace(outlived, num_output_tokens=20)) == 21
    # The admission gate sees the capped reservation: 48 tokens of cache hold a running request's
    # 20 + 20 and a newcomer's 4 + 4 (with 20 + 32 reserved, the newcomer was held back).
    policy = EcoServePolicy(bucket_edges=EDGES, pipelining=False)
    ctx = SchedContext(0.0, 0, 2048, 12, 12, 4, 256)
    big = Req(predicted_output_tokens=10**9, max_output_tokens=20, req_id="big", num_prompt_tokens=20)
    running = [replace(big, num_computed_prompt_tokens=20, num_computed_tokens=20, num_output_tokens=1)]
    newcomer = Req(predicted_output_tokens=1, max_output_tokens=4, req_id="small", num_prompt_tokens=4)
    assert policy.admission_limit(running, [newcomer], ctx) == 1


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


@dataclass(frozen=True)
class Params:
    extra_args: dict[str, int]


@dataclass(frozen=True)
class VllmLike:
    """What VllmRequestView reads of a vLLM request for EcoServe's reservation."""

    max_tokens: int
    num_prompt_tokens: int
    sampling_params: Params
    num_output_tokens: int = 0


def test_the_vllm_view_caps_the_response_at_the_room_max_model_len_leaves() -> None:
    # vLLM stops a request at max_model_len whatever its max_tokens: a 500-token prompt on a 512-token
    # model generates at most 12 tokens, but EcoServe reserved the bucket of max_tokens (1,000).
    from serving.vllm_ext.request_view import VllmRequestView

    request = VllmLike(1000, 500, Params({"predicted_output_tokens": 10**9}))
    policy = EcoServePolicy(bucket_edges=EDGES)
    view = VllmRequestView(request, 0, max_model_len=512)  # type: ignore[arg-type]
    assert view.max_output_tokens == 12 and policy.predicted_output(view) == 12
    assert VllmRequestView(request, 0, max_model_len=400).max_output_tokens == 0  # type: ignore[arg-type]
    assert VllmRequestView(request, 0).max_output_tokens == 1000  # type: ignore[arg-type]
