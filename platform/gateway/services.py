"""The gateway's synchronous domain operations (the ASGI app calls them in a worker thread).

- ``admit``: API key -> model -> quotas (the request's token reservation) -> the model's healthy
  replicas, in one call, so that a request costs one hop to the database thread before it is proxied.
- ``finish``: record usage (per key, model and UTC day, atomic ``F()`` updates that work on SQLite
  and PostgreSQL), release the request's token reservation, and record its latency sample.
- ``release``: release an admitted request's reservation where it never reaches ``finish``.
- ``served_models`` for /v1/models, ``served_model`` for /v1/models/{model} (and
  ``served_model_names`` for the playground), and
  ``latency_summary`` for the dashboard's SLO charts.
- ``prune_request_samples``: drops latency samples past ``REQUEST_SAMPLE_RETENTION`` (run with the
  telemetry retention, agents/retention.py, as ``reservations.prune_token_reservations`` is).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from accounts.models import ApiKey
from accounts.services import authenticate_api_key
from agents.models import Replica
from deployments.engine_keys import engine_api_key
from deployments.models import Deployment, DesiredState, ObservedState
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef, QuerySet
from django.utils import timezone
from inventory.models import HostStatus
from registry.models import ServedModel

from gateway.errors import model_not_found, unauthorized, unavailable
from gateway.estimate import TokenEstimate, estimate_tokens
from gateway.models import RequestSample, Usage
from gateway.quota import RateLimits, database_now, day_start, rate_limits, take_request
from gateway.reservations import release_reservation, reserve_tokens
from gateway.routing import Target
from serving.metrics.latency import percentile

# One RequestSample per proxied request (thousands a minute); the latency API reads at most a
# week back (its ``window_s``), so older samples are never read.
REQUEST_SAMPLE_RETENTION = timedelta(days=7)

log = logging.getLogger(__name__)


@dataclass
class Reservation:
    """An admission's token reservation (gateway/reservations.py); ``released`` once it is dropped."""

    id: int
    released: bool = False
    estimate: TokenEstimate | None = None  # what it reserved: the most the request may cost


@dataclass(frozen=True)
class Admission:
    """An admitted request: who pays for it, which model, and where it may go."""

    key_id: int
    model_id: int
    model_name: str  # the engine's served model name (agents pass --served-model-name <name>)
    targets: list[Target]
    limits: RateLimits | None = None  # the key's limits after this request (response headers)
    # When it was admitted, by the database clock (the quotas' clock): its usage is booked to that
    # day, the day whose quota admitted it. None: booked by this host's clock when it finishes.
    admitted_at: datetime | None = None
    # The tokens it holds against the key's daily quota until it ends (`finish` or `release`).
    reservation: Reservation | None = None
    # The key's owner: whose share of the engines' prefix cache it uses (gateway/cache_salt.py).
    user_id: int | None = None


@dataclass(frozen=True)
class Outcome:
    """What a finished request did, as the proxy measured it."""

    deployment_id: int | None
    stream: bool
    outcome: str  # "completed", "disconnected" or "failed"
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float | None
    tbt_mean_s: float | None
    tbt_max_s: float | None


def authenticate(authorization: str | None) -> ApiKey:
    """The key named by an ``Authorization: Bearer sk-...`` header; 401 otherwise."""
    if not authorization:
        raise unauthorized("Missing API key: send 'Authorization: Bearer <key>'.")
    scheme, _, secret = authorization.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise unauthorized("Malformed Authorization header: expected 'Bearer <key>'.")
    key = authenticate_api_key(secret.strip())
    if key is None:
        raise unauthorized("Invalid or revoked API key.")
    return key


def healthy_targets(model: ServedModel) -> list[Target]:
    """Replicas of ``model`` that can take a request: the deployment should run and does, the
    engine reported a URL, and the host's agent is online. Ordered by replica id."""
    replicas = (
        Replica.objects.filter(
            deployment__model=model,
            deployment__desired_state=DesiredState.RUNNING,
            deployment__observed_state=ObservedState.RUNNING,
            deployment__host__status=HostStatus.ONLINE,
            state="running",
        )
        .exclude(base_url="")
        .order_by("id")
        .values_list("id", "deployment_id", "base_url")
    )
    return [
        Target(replica_id, deployment_id, url, engine_api_key(deployment_id))
        for replica_id, deployment_id, url in replicas
    ]


def admit(
    key: ApiKey,
    model_name: str,
    now: datetime | None = None,
    *,
    body: dict[str, Any] | None = None,
    kind: str | None = None,
) -> Admission:
    """Find the model, apply the (authenticated) key's quotas, list healthy replicas.

    The token quota reserves the most the request may cost (gateway/estimate.py, from its
    validated ``body`` of endpoint ``kind``, "chat" or "completion", None: told by the body's
    shape; without a body, as a chat without max_tokens, the model's whole context)
    until ``finish`` (or ``release``) replaces it with what it used. A refusal after the
    reservation (no healthy replica, the rate limit) releases it again.

    ``now`` defaults to the database server's clock (`database_now`), not this host's: the limits
    are shared by every web host, so they keep one clock. It is the time of the rate limit, the
    token quota's day and the limits' headers alike.

    A model /v1/models does not list (unknown, or with no deployment that should run) is a 404,
    as /v1/models/{model} answers: no replica of it will come up by retrying. A listed model
    without a healthy replica right now is a 503 with Retry-After. The served test is part of the
    model's lookup (one query, as before).

    Raises:
        GatewayError: 404 unknown or unserved model, 429 over a quota, 400 a request that may
            cost more than the key's whole daily quota, 503 no healthy replica.
    """
    now = now or database_now()
    model = _served().filter(name=model_name).first()
    if model is None:
        raise model_not_found(model_name)
    estimate = estimate_tokens(body or {}, model.max_context_length, kind)
    reservation_id, tokens_held = reserve_tokens(key, now, estimate)
    try:
        targets = healthy_targets(model)
        if not targets:
            raise unavailable(
                f"No healthy replica of model '{model_name}' is available; retry later.",
                settings.GATEWAY_UNAVAILABLE_RETRY_AFTER_S,
            )
        remaining, reset_s = take_request(key, now, tokens_held - estimate.total)
    except BaseException:
        release_reservation(reservation_id)
        raise
    limits = rate_limits(key, now, tokens_held, remaining, reset_s)
    reservation = Reservation(reservation_id, estimate=estimate)
    return Admission(
        key.pk,
        model.pk,
        model.name,
        targets,
        limits,
        admitted_at=now,
        reservation=reservation,
        user_id=key.owner_id,
    )


def release(admission: Admission) -> None:
    """Drop the admission's token reservation, once: a request that ends without ``finish``."""
    if admission.reservation is not None and not admission.reservation.released:
        release_reservation(admission.reservation.id)
        admission.reservation.released = True


def record_usage(
    key_id: int,
    model_id: int,
    prompt_tokens: int,
    completion_tokens: int,
    now: datetime | None = None,
    *,
    model_name: str | None = None,
) -> None:
    """Add one request and its tokens to the key's usage of ``model_id`` (named ``model_name``,
    read from the registry if not given) for the current day.

    A model deleted while the request ran (a stream outlives its deployment's delete) is billed
    under ``model_name`` on a row without the link, as its earlier rows are kept; usage of a key
    deleted meanwhile (one without usage yet: keys with usage are protected) is dropped."""
    period = day_start(now or timezone.now())
    rows = Usage.objects.filter(key_id=key_id, model_id=model_id, period_start=period)
    # The name it was used under: a model renamed today had its later requests shown under the
    # old name all day (usage of "tiny-v2" listed as "tiny").
    named = {"model_name": model_name} if model_name else {}
    if rows.update(**_usage_increments(prompt_tokens, completion_tokens), **named):
        return
    if model_name is None:
        model_name = ServedModel.objects.filter(pk=model_id).values_list("name", flat=True).first()
    try:
        with transaction.atomic():
            Usage.objects.create(
                key_id=key_id,
                model_id=model_id,
                model_name=model_name or f"model {model_id}",
                period_start=period,
                requests=1,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
            )
        return
    except IntegrityError:  # created concurrently (add to it), or the model or key is gone
        pass
    if not rows.update(**_usage_increments(prompt_tokens, completion_tokens), **named):
        _record_unlinked_usage(
            key_id, model_name or f"model {model_id}", period, prompt_tokens, completion_tokens
        )


def _usage_increments(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "requests": F("requests") + 1,
        "prompt_tokens": F("prompt_tokens") + prompt_tokens,
        "completion_tokens": F("completion_tokens") + completion_tokens,
    }


def _record_unlinked_usage(
    key_id: int, model_name: str, period: datetime, prompt_tokens: int, completion_tokens: int
) -> None:
    """Book usage of a deleted model on the key's row for that name and day without a model
    (made here if missing; the key's row lock makes two late requests share one row)."""
    with transaction.atomic():
        if not ApiKey.objects.select_for_update().filter(pk=key_id).exists():
            log.warning("Usage of API key %s, deleted while its request ran, is dropped.", key_id)
            return
        rows = Usage.objects.filter(
            key_id=key_id, model__isnull=True, model_name=model_name, period_start=period
        )
        if rows.update(**_usage_increments(prompt_tokens, completion_tokens)):
            return
        Usage.objects.create(
            key_id=key_id,
            model=None,
            model_name=model_name,
            period_start=period,
            requests=1,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )


def finish(admission: Admission, outcome: Outcome) -> None:
    """Record a proxied request's usage (in the day it was admitted), release its reservation
    (after: until then an admission sees its tokens in either, never in neither) and record its
    latency sample."""
    now = timezone.now()
    record_usage(
        admission.key_id,
        admission.model_id,
        outcome.prompt_tokens,
        outcome.completion_tokens,
        admission.admitted_at or now,
        model_name=admission.model_name,
    )
    release(admission)
    # The replica's deployment, or the model itself, may have been deleted while the request ran:
    # a sample without its deployment still counts towards the model's SLO metrics. The proxy calls
    # this in autocommit (a worker thread, no transaction): a refused insert leaves no transaction
    # to roll back, so none is opened on this per-request path (it would cost a BEGIN and COMMIT).
    for deployment_id in dict.fromkeys((outcome.deployment_id, None)):
        try:
            _record_sample(admission, outcome, deployment_id, now)
            return
        except IntegrityError:
            continue
    log.info("Latency sample of deleted model %s dropped.", admission.model_name)


def _record_sample(admission: Admission, outcome: Outcome, deployment_id: int | None, now: datetime) -> None:
    RequestSample.objects.create(
        model_id=admission.model_id,
        deployment_id=deployment_id,
        ts=now,
        stream=outcome.stream,
        outcome=outcome.outcome,
        ttft_s=outcome.ttft_s,
        tbt_mean_s=outcome.tbt_mean_s,
        tbt_max_s=outcome.tbt_max_s,
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
    )


def prune_request_samples(now: datetime | None = None) -> int:
    """Delete request samples older than ``REQUEST_SAMPLE_RETENTION``; returns how many."""
    cutoff = (now or timezone.now()) - REQUEST_SAMPLE_RETENTION
    deleted, _ = RequestSample.objects.filter(ts__lt=cutoff).delete()
    return deleted


def _served() -> QuerySet[ServedModel]:
    """The models a key may see and use: those with a deployment that should be running on a real
    host (/v1/models lists them; ``admit`` answers 404 for any other). A simulated host (the
    cluster view's demo hosts) runs no engine, so a model deployed only there is never served."""
    running = Deployment.objects.filter(
        model=OuterRef("pk"), desired_state=DesiredState.RUNNING, host__simulated=False
    )
    return ServedModel.objects.filter(Exists(running))


def served_model_names() -> list[str]:
    """The names /v1/models lists, in its order (the playground's model menu)."""
    return list(_served().order_by("name").values_list("name", flat=True))


def simulated_only_model_names() -> list[str]:
    """The models deployed to run only on simulated hosts (not served: they have no engine), so
    that the playground can say why it offers none of them."""
    on_simulated = Deployment.objects.filter(
        model=OuterRef("pk"), desired_state=DesiredState.RUNNING, host__simulated=True
    )
    models = ServedModel.objects.filter(Exists(on_simulated)).exclude(pk__in=_served().values("pk"))
    return list(models.order_by("name").values_list("name", flat=True))


def _model_object(model: ServedModel) -> dict[str, object]:
    created = int(model.created_at.timestamp())
    return {"id": model.name, "object": "model", "created": created, "owned_by": "platform"}


def served_models(authorization: str | None) -> list[dict[str, object]]:
    """/v1/models: the served models (key required)."""
    authenticate(authorization)
    return [_model_object(m) for m in _served().order_by("name")]


def served_model(authorization: str | None, name: str) -> dict[str, object]:
    """/v1/models/{name}: the model as /v1/models lists it; 404 if it does not list it (key required)."""
    authenticate(authorization)
    model = _served().filter(name=name).first()
    if model is None:
        raise model_not_found(name)
    return _model_object(model)


def _percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (q in [0, 100]), linearly interpolated as everywhere else
    (serving.metrics.percentile); None without values."""
    return percentile(values, q) if values else None


def latency_summary(model: ServedModel, window: timedelta = timedelta(minutes=10)) -> dict[str, object]:
    """Percentiles over the model's requests through the gateway in the last ``window``.

    The gateway keeps per request only its TTFT and the mean and largest gap between its streamed
    token chunks, not every gap, so the time between tokens (TBT: every gap of every request, what
    the model's ``slo_tbt_p99_ms`` bounds) cannot be recomputed exactly. Counted:

    - ``requests``: every request an engine took, as the usage (``/api/v1/gateway/usage/``) counts
      them: those it refused (a 400) or cut off included;
    - ``failed``: of them, those that ended in the engine's error (refused, or cut off);
    - ``ttft_requests``: those that got a first token, which the TTFT percentiles are over.

    Reported (seconds):

    - ``ttft_p50_s``, ``ttft_p99_s``: of each request's time to first token.
    - ``tpot_p50_s``, ``tpot_p99_s``: of each streamed request's mean gap (its time per output
      token, TPOT); a long answer's stall barely moves its mean, so this is not comparable with
      ``tbt_slo_s``.
    - ``tbt_max_p99_s``: of each streamed request's largest gap, which bounds every gap of that
      request: about 1% of requests had a gap above it. This is the figure to hold against
      ``tbt_slo_s``; it is usually above the all-gaps TBT p99, but not a bound on it (a few long
      requests with slow gaps throughout can hold more than 1% of all gaps).
    - ``tbt_p50_s``, ``tbt_p99_s``: deprecated aliases of ``tpot_p50_s``, ``tpot_p99_s`` (what
      they always held), kept for older clients.
    """
    since = timezone.now() - window
    samples = list(
        RequestSample.objects.filter(model=model, ts__gte=since).values_list(
            "ttft_s", "tbt_mean_s", "tbt_max_s", "outcome"
        )
    )
    ttft = [s[0] for s in samples if s[0] is not None]
    tpot = [s[1] for s in samples if s[1] is not None]
    worst_gap = [s[2] for s in samples if s[2] is not None]
    tpot_p50, tpot_p99 = _percentile(tpot, 50), _percentile(tpot, 99)
    return {
        "requests": len(samples),
        "failed": sum(1 for s in samples if s[3] == "failed"),
        "ttft_requests": len(ttft),
        "ttft_p50_s": _percentile(ttft, 50),
        "ttft_p99_s": _percentile(ttft, 99),
        "tpot_p50_s": tpot_p50,
        "tpot_p99_s": tpot_p99,
        "tbt_max_p99_s": _percentile(worst_gap, 99),
        "tbt_p50_s": tpot_p50,
        "tbt_p99_s": tpot_p99,
        "ttft_slo_s": model.slo_ttft_p99_ms / 1000,
        "tbt_slo_s": model.slo_tbt_p99_ms / 1000,
    }
