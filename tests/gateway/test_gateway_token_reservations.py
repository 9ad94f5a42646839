"""The daily token quota reserves a request's most possible cost at admission (prompt estimate +
n x max_tokens) and settles it to the real usage when the request ends, so a key cannot overshoot
its quota by a large response or by many concurrent ones."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from accounts.models import ApiKey
from accounts.services import create_api_key
from agents.retention import downsample_and_prune
from django.db import connection
from gateway import reservations, services
from gateway.errors import GatewayError
from gateway.estimate import DEFAULT_MAX_OUTPUT_TOKENS, estimate_tokens
from gateway.models import RequestSample, TokenReservation, Usage
from gateway.proxy import GatewayApp
from gateway.quota import database_now, tokens_held_today
from gateway.reservations import prune_token_reservations
from gateway.services import Outcome, admit, finish, record_usage

from tests.gateway.asgi_driver import CHAT, Call, app_with, call, never
from tests.gateway.quota_check import check_token_quota

NOW = datetime(2026, 3, 4, 10, 20, 45, tzinfo=UTC)
MIDNIGHT = datetime(2026, 3, 5, tzinfo=UTC)


def key_with(data: dict[str, Any], tokens_per_day: int, name: str = "q") -> tuple[ApiKey, str]:
    issued = create_api_key(data["user"], name, requests_per_minute=1000, tokens_per_day=tokens_per_day)
    return issued.record, issued.plaintext


def refusal(key: ApiKey, body: dict[str, Any], at: datetime = NOW) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        admit(key, "tiny", at, body=body)
    return caught.value


def test_it_estimates_prompt_characters_and_n_times_the_output_limit() -> None:
    chat = {"messages": [{"role": "user", "content": "x" * 10}], "max_tokens": 50, "n": 3}
    assert estimate_tokens(chat, 4096).total == 3 + 3 * 50  # ceil(10 / 4) + n x max_tokens
    newer = {**chat, "max_completion_tokens": 20}  # takes precedence, as in OpenAI and vLLM
    assert (estimate_tokens(newer, 4096).total, estimate_tokens(newer, 4096).limit_field) == (
        3 + 60,
        "max_completion_tokens",
    )
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "y" * 8}]}], "max_tokens": 1}
    assert estimate_tokens(parts, 4096).total == 2 + 1
    # A completions batch: every prompt gets n completions; token-id prompts count exactly.
    batch = {"prompt": ["abcd", [1, 2, 3]], "max_tokens": 5, "n": 2}
    assert estimate_tokens(batch, 4096).total == (1 + 3) + 2 * 2 * 5
    assert estimate_tokens({"prompt": [7, 8, 9], "max_tokens": 2}, 4096).total == 3 + 2
    # A completion with a stray "messages": null (extra fields pass on to the engine) is a completion.
    assert estimate_tokens({"prompt": "hi", "messages": None, "max_tokens": 2}, 4096).total == 1 + 2
    # No output limit (a chat's, or a completion's null max_tokens): until the context is full
    # (vLLM's default), or the documented default.
    assert estimate_tokens({"messages": [{"content": "x" * 40}], "n": 2}, 256).total == 10 + 2 * (256 - 10)
    assert (
        estimate_tokens({"prompt": "x" * 40, "max_tokens": None}, None).total
        == 10 + DEFAULT_MAX_OUTPUT_TOKENS
    )
    # No completion can outgrow the context.
    assert estimate_tokens({"prompt": "x" * 40, "max_tokens": 10_000}, 256).total == 256


def test_it_reserves_for_a_completion_what_vllm_may_generate_for_it() -> None:
    """/v1/completions has no max_completion_tokens (vLLM ignores it there) and its max_tokens
    defaults to 16, as OpenAI's; a null max_tokens lets it fill the context."""
    prompt = "x" * 40  # 10 tokens
    assert estimate_tokens({"prompt": prompt}, 256, "completion").total == 10 + 16
    assert estimate_tokens({"prompt": prompt, "n": 2}, 256).total == 10 + 2 * 16
    ignored = estimate_tokens({"prompt": prompt, "max_completion_tokens": 1, "max_tokens": None}, 256)
    assert (ignored.total, ignored.limit_field) == (256, "max_tokens")
    capped = estimate_tokens({"prompt": prompt, "max_completion_tokens": 1, "max_tokens": 30}, 256)
    assert (capped.total, capped.limit_field) == (10 + 30, "max_tokens")
    # The endpoint decides, not the body's shape: a completion's stray "messages" list is no prompt.
    stray = {"prompt": "y" * 400, "messages": [{"role": "user", "content": ""}], "max_tokens": 1}
    assert estimate_tokens(stray, 256, "completion").total == 100 + 1


def test_a_completion_is_admitted_or_refused_by_what_the_engine_may_generate(
    gateway_data: dict[str, Any],
) -> None:
    _, secret = key_with(gateway_data, 100)

    def answer(request: httpx.Request) -> httpx.Response:
        usage = {"prompt_tokens": 1, "completion_tokens": 16, "total_tokens": 17}
        return httpx.Response(200, json={"choices": [], "usage": usage})

    app = app_with(answer)
    # No max_tokens: at most 16 tokens, well within the quota (it used to be held to the context).
    plain = asyncio.run(call(app, "/v1/completions", {"model": "tiny", "prompt": "hi"}, secret))
    assert plain.status == 200
    # max_completion_tokens does not bound a completion: max_tokens null lets it fill the context.
    body = {"model": "tiny", "prompt": "hi", "max_completion_tokens": 1, "max_tokens": None}
    unbounded = asyncio.run(call(app, "/v1/completions", body, secret))
    assert unbounded.status == 400
    assert (unbounded.json()["error"]["code"], unbounded.json()["error"]["param"]) == (
        "request_too_large",
        "max_tokens",
    )
    # A long prompt beside a stray "messages" list is still counted.
    stray = {
        "model": "tiny",
        "prompt": "y" * 400,
        "messages": [{"role": "user", "content": ""}],
        "max_tokens": 1,
    }
    assert asyncio.run(call(app, "/v1/completions", stray, secret)).status == 400
    assert not TokenReservation.objects.exists()


def test_a_request_whose_outputs_exceed_what_is_left_is_refused_before_the_engine(
    gateway_data: dict[str, Any],
) -> None:
    key, secret = key_with(gateway_data, 1000)
    record_usage(key.pk, gateway_data["model"].pk, 400, 500, database_now())  # 900 of 1000 used
    body = {**CHAT, "n": 2, "max_tokens": 100}  # may cost 1 + 200: it used to be served in full
    result = asyncio.run(call(app_with(never), "/v1/chat/completions", body, secret))
    assert result.status == 429 and int(result.headers[b"retry-after"]) > 0
    error = result.json()["error"]
    assert error["code"] == "tokens_quota_exceeded" and error["type"] == "rate_limit_error"
    assert "up to 201 tokens" in error["message"]
    assert "900 used and 0 reserved by requests in flight, of 1000 tokens" in error["message"]
    assert not TokenReservation.objects.exists()
    # One that fits what is left is admitted.
    ok = {**CHAT, "max_tokens": 99}

    def answer(request: httpx.Request) -> httpx.Response:
        usage = {"prompt_tokens": 1, "completion_tokens": 99, "total_tokens": 100}
        return httpx.Response(200, json={"choices": [], "usage": usage})

    assert asyncio.run(call(app_with(answer), "/v1/chat/completions", ok, secret)).status == 200
    assert tokens_held_today(key.pk, database_now()) == (1000, 0)  # booked; released


def test_a_request_that_may_cost_more_than_the_whole_quota_is_a_400_naming_its_limit(
    gateway_data: dict[str, Any],
) -> None:
    key, secret = key_with(gateway_data, 100)
    result = asyncio.run(
        call(app_with(never), "/v1/chat/completions", {**CHAT, "max_completion_tokens": 200}, secret)
    )
    assert result.status == 400 and b"retry-after" not in result.headers
    error = result.json()["error"]
    assert (error["code"], error["param"]) == ("request_too_large", "max_completion_tokens")
    assert "up to 201 tokens" in error["message"] and "daily quota of 100" in error["message"]
    assert "lower max_completion_tokens" in error["message"]
    # Without a limit it may fill the model's context (256 tokens): say which field to set.
    unlimited = refusal(key, {"model": "tiny", "prompt": "hi", "max_tokens": None})
    assert (unlimited.status, unlimited.param) == (400, "max_tokens")
    assert not TokenReservation.objects.exists()
    # A key whose day is used up says so first, whatever the request.
    record_usage(key.pk, gateway_data["model"].pk, 60, 40, NOW)
    spent = refusal(key, {"model": "tiny", "prompt": "hi", "max_tokens": 500})
    assert (spent.status, spent.code) == (429, "tokens_quota_exceeded")
    assert spent.retry_after_s == int((MIDNIGHT - NOW).total_seconds()) + 1


def test_requests_in_flight_hold_their_estimates_until_they_finish(gateway_data: dict[str, Any]) -> None:
    key, _ = key_with(gateway_data, 700)
    body = {"model": "tiny", "prompt": "abcd", "max_tokens": 199}  # 1 + 199 = 200 each
    first, second, third = (admit(key, "tiny", NOW, body=body) for _ in range(3))
    assert TokenReservation.objects.filter(key=key).count() == 3
    # Headers count reservations, this request's included.
    remaining = [a.limits.tokens_remaining for a in (first, second, third)]  # type: ignore[union-attr]
    assert remaining == [500, 300, 100]
    blocked = refusal(key, body)
    assert (blocked.status, blocked.code) == (429, "tokens_quota_exceeded")
    assert "0 used and 600 reserved" in blocked.message
    assert blocked.retry_after_s is not None and blocked.retry_after_s < 60, "in-flight ones end soon"
    # The first ends having used 20 tokens: they are booked, its 200 released.
    finish(first, Outcome(None, False, "completed", 1, 19, None, None, None))
    assert check_token_quota(key, NOW) == (20, 400)
    fourth = admit(key, "tiny", NOW, body=body)
    assert fourth.limits is not None and fourth.limits.tokens_remaining == 700 - 20 - 600
    assert Usage.objects.get(key=key).total_tokens == 20


def test_a_refusal_after_the_reservation_releases_it(gateway_data: dict[str, Any]) -> None:
    issued = create_api_key(gateway_data["user"], "rpm", requests_per_minute=1, tokens_per_day=1000)
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 10}
    admit(issued.record, "tiny", NOW, body=body)
    with pytest.raises(GatewayError) as caught:  # over the rate limit
        admit(issued.record, "tiny", NOW, body=body)
    assert caught.value.code == "rate_limit_exceeded"
    assert TokenReservation.objects.filter(key=issued.record).count() == 1
    gateway_data["host"].status = "offline"
    gateway_data["host"].save()
    with pytest.raises(GatewayError) as caught:  # no healthy replica
        admit(gateway_data["key"], "tiny", NOW, body=body)
    assert caught.value.status == 503
    assert not TokenReservation.objects.filter(key=gateway_data["key"]).exists()


def completed(request: httpx.Request) -> httpx.Response:
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    return httpx.Response(200, json={"choices": [{"index": 0, "text": "x"}], "usage": usage})


def engine_refused(request: httpx.Request) -> httpx.Response:
    return httpx.Response(400, json={"error": {"message": "bad", "type": "BadRequestError", "code": 400}})


def every_replica_failed(request: httpx.Request) -> httpx.Response:
    return httpx.Response(503, json={"error": "overloaded"})


def unreachable(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


@pytest.mark.parametrize(
    ("upstream", "status", "booked"),
    [(completed, 200, 10), (engine_refused, 400, 0), (every_replica_failed, 503, 0), (unreachable, 503, 0)],
    ids=["completed", "engine-error", "every-replica-5xx", "no-connection"],
)
def test_a_request_releases_its_reservation_whatever_its_outcome(
    gateway_data: dict[str, Any], upstream: Any, status: int, booked: int
) -> None:
    key, secret = key_with(gateway_data, 10_000)
    result = asyncio.run(
        call(app_with(upstream), "/v1/completions", {"model": "tiny", "prompt": "hi"}, secret)
    )
    assert result.status == status
    if status == 200:  # the headers hold its reservation: the prompt and 16 (a completion's default)
        assert result.headers[b"x-ratelimit-remaining-tokens"] == str(10_000 - 1 - 16).encode()
    assert not TokenReservation.objects.exists()
    assert sum(u.total_tokens for u in Usage.objects.filter(key=key)) == booked


def test_a_client_that_leaves_before_any_engine_took_the_request_releases_it(
    gateway_data: dict[str, Any],
) -> None:
    connecting = asyncio.Event()

    async def hangs(request: httpx.Request) -> httpx.Response:  # a connect that never completes
        connecting.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    # A plain MockTransport: no trace, so no engine ever had the request (finish is not called).
    app = GatewayApp(client_factory=lambda: httpx.AsyncClient(transport=httpx.MockTransport(hangs)))

    async def leave(result: Call) -> None:
        await connecting.wait()

    asyncio.run(call(app, "/v1/chat/completions", CHAT, gateway_data["secret"], disconnect=leave))
    assert not Usage.objects.exists()
    assert not TokenReservation.objects.exists()


def test_a_request_cancelled_while_it_is_admitted_releases_its_reservation(
    gateway_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Daphne cancels a request's task (shutdown, a client gone) while admit runs in its thread: the
    thread completes the admission all the same, and its reservation must not hold the quota."""
    admitting, go_on, admitted = threading.Event(), threading.Event(), threading.Event()
    real_admit = services.admit

    def slow_admit(*args: Any, **kwargs: Any) -> Any:
        admitting.set()
        go_on.wait(10)
        try:
            return real_admit(*args, **kwargs)
        finally:
            admitted.set()

    monkeypatch.setattr(services, "admit", slow_admit)

    async def cancelled_mid_admission() -> None:
        task = asyncio.ensure_future(
            call(
                app_with(completed),
                "/v1/completions",
                {"model": "tiny", "prompt": "hi"},
                gateway_data["secret"],
            )
        )
        assert await asyncio.to_thread(admitting.wait, 10)
        task.cancel()
        go_on.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled_mid_admission())
    assert admitted.wait(10)  # the admission did complete (and reserved) ...
    assert not TokenReservation.objects.exists()  # ... and was released
    assert not Usage.objects.exists()


def test_an_expired_reservation_is_ignored_and_pruned(gateway_data: dict[str, Any]) -> None:
    key, _ = key_with(gateway_data, 1000)
    # A web process died mid-request: its reservation of the whole quota stays behind.
    TokenReservation.objects.create(
        key=key, tokens=1000, created_at=NOW - timedelta(minutes=20), expires_at=NOW - timedelta(minutes=5)
    )
    live = TokenReservation.objects.create(
        key=key, tokens=100, created_at=NOW, expires_at=NOW + timedelta(minutes=15)
    )
    # Yesterday's unexpired reservation counts against yesterday, whose usage it will be booked to.
    TokenReservation.objects.create(
        key=key,
        tokens=500,
        created_at=datetime(2026, 3, 3, 23, 59, tzinfo=UTC),
        expires_at=NOW + timedelta(minutes=1),
    )
    assert check_token_quota(key, NOW) == (0, 100)
    admission = admit(key, "tiny", NOW, body={"model": "tiny", "prompt": "hi", "max_tokens": 99})
    assert admission.limits is not None and admission.limits.tokens_remaining == 800
    assert prune_token_reservations(NOW) == 1
    assert TokenReservation.objects.filter(key=key).count() == 3 and TokenReservation.objects.filter(
        pk=live.pk
    )
    # The periodic retention prunes by the database clock.
    TokenReservation.objects.update(expires_at=database_now() - timedelta(seconds=1))
    assert downsample_and_prune().reservations_deleted == 3
    assert not TokenReservation.objects.exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="concurrent writers: the PostgreSQL path")
def test_concurrent_admissions_of_one_key_reserve_no_more_than_its_quota(
    gateway_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    key, _ = key_with(gateway_data, 1000)
    # Widen the window between reading the key's totals and booking the reservation, where
    # admissions that did not take turns would all read the same totals and all pass.
    check = reservations.refuse_over_quota

    def slow_check(*args: Any) -> None:
        time.sleep(0.05)
        check(*args)

    monkeypatch.setattr(reservations, "refuse_over_quota", slow_check)
    body = {"model": "tiny", "prompt": "abcd", "max_tokens": 199}  # 200 each: 5 fit
    callers = 16
    start = threading.Barrier(callers)
    outcomes: list[str] = []

    def one() -> None:
        try:
            start.wait(timeout=10)
            try:
                admit(key, "tiny", body=body)
                outcomes.append("admitted")
            except GatewayError as refused:
                outcomes.append(refused.code or str(refused.status))
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(outcomes) == callers
    assert outcomes.count("admitted") == 5, outcomes
    assert set(outcomes) == {"admitted", "tokens_quota_exceeded"}
    assert sorted(TokenReservation.objects.filter(key=key).values_list("tokens", flat=True)) == [200] * 5


def text_delta(text: str) -> bytes:
    return b'data: {"id": "c1", "choices": [{"index": 0, "delta": {"content": "%s"}}]}\n\n' % text.encode()


@pytest.mark.parametrize(
    ("body", "answer", "prompt_count", "booked"),
    [
        # max_tokens 3: the most the engine may have generated, though 2 deltas came.
        ({**CHAT, "stream": True}, text_delta("a") + text_delta("b") + b"data: [DONE]\n\n", 9, (9, 3)),
        # More deltas than the limit allows (a misbehaving engine): one token each, at least.
        ({**CHAT, "stream": True, "max_tokens": 1}, text_delta("a") + text_delta("b"), 9, (9, 2)),
        # A whole answer, n=2 of up to 3 tokens; the engine counts no prompt: the estimate's.
        (
            {**CHAT, "n": 2},
            b'{"id": "c1", "choices": [{"index": 0, "message": {"content": "a"}}]}',
            None,
            (1, 6),
        ),
    ],
)
def test_text_served_without_usage_is_booked_with_the_most_it_may_have_cost(
    gateway_data: dict[str, Any],
    body: dict[str, Any],
    answer: bytes,
    prompt_count: int | None,
    booked: tuple[int, int],
) -> None:
    """Once an engine that sent no usage (one behind a proxy that drops stream_options, or that
    does not report it) had its request booked as 0 tokens, whatever it streamed: free tokens,
    outside the key's quota. Now the prompt is the engine's count (else the estimate), the output
    the reservation's bound for it (at least one token per text delta)."""
    key, secret = key_with(gateway_data, 10_000)

    def upstream(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"count": prompt_count}) if prompt_count else httpx.Response(404)
        return httpx.Response(200, content=answer)

    result = asyncio.run(call(app_with(upstream), "/v1/chat/completions", body, secret))
    assert result.status == 200
    usage, sample = Usage.objects.get(key=key), RequestSample.objects.get()
    assert (usage.prompt_tokens, usage.completion_tokens) == booked
    assert (sample.prompt_tokens, sample.completion_tokens) == booked
    assert not TokenReservation.objects.exists()


def test_an_answer_without_text_or_usage_books_no_output(gateway_data: dict[str, Any]) -> None:
    key, secret = key_with(gateway_data, 10_000)
    answer = b'data: {"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}\n\n'
    app = app_with(lambda request: httpx.Response(200, content=answer + b"data: [DONE]\n\n"))
    asyncio.run(call(app, "/v1/chat/completions", {**CHAT, "stream": True}, secret))
    usage = Usage.objects.get(key=key)
    assert (usage.prompt_tokens, usage.completion_tokens) == (0, 0)
