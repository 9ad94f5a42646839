"""The chat playground's script against crafted /v1 answers: split events, error events, cut-off
streams, error statuses, "New chat" mid-reply, revoked keys, long replies.

A stand-in ``fetch`` (installed before the page's scripts run) answers /v1 requests with a stream
the test feeds byte by byte, or with a queued whole answer; the page, its key endpoint and the
database are real. The revoked-key test answers /v1 with ``page.route`` instead, checking the key
against the database the way the gateway does.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from accounts.models import ApiKey, User
from accounts.services import authenticate_api_key, create_api_key, revoke_api_key
from deployments.models import Deployment
from django.conf import settings
from inventory.services import register_host
from registry.models import ServedModel

from tests.browser.conftest import db_call, sign_in
from tests.fleet.servers import AsgiServer

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

HOSTILE = '<img src=x onerror="window.__xss = 1">'
FAKE_FETCH = """
window.__requests = [];  // {body, auth, aborted, push(bytes), end()} per /v1 request
window.__answers = [];   // queued whole answers {status, headers, body}; none: a stream to feed
const realFetch = window.fetch.bind(window);
window.fetch = (url, init = {}) => {
  if (!String(url).startsWith("/v1/")) return realFetch(url, init);
  const request = { body: JSON.parse(init.body), auth: init.headers.Authorization, aborted: false };
  window.__requests.push(request);
  const answer = window.__answers.shift();
  if (answer) return Promise.resolve(new Response(answer.body, answer));
  let stream;
  const body = new ReadableStream({ start(controller) { stream = controller; } });
  request.push = (bytes) => stream.enqueue(new Uint8Array(bytes));
  request.end = () => { if (!request.aborted) stream.close(); };
  init.signal.addEventListener("abort", () => {
    request.aborted = true;
    try { stream.error(new DOMException("aborted", "AbortError")); } catch (e) {}
  });
  return Promise.resolve(new Response(body, { headers: { "content-type": "text/event-stream" } }));
};
"""


def event(payload: Any) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def delta(text: str, finish: str | None = None) -> bytes:
    return event({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]})


def _served_model() -> None:
    model = ServedModel.objects.create(
        name="tiny", source="org/tiny", max_context_length=256, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
    )
    Deployment.objects.create(model=model, host=register_host("gpu-h", "127.0.0.1"))


@pytest.fixture(autouse=True)
def served_model(transactional_db: None) -> None:
    """A model the page's menu lists (a running deployment on a real host): with none, the page
    refuses to send at all."""
    db_call(_served_model)


def open_playground(browser: Any, server: AsgiServer) -> Any:
    page = sign_in(browser, server.url, "ada", "/playground/")
    page.context.add_init_script(FAKE_FETCH)
    page.goto("/playground/")
    return page


def send(page: Any, text: str) -> dict[str, Any]:
    """Type ``text``, press Enter; the /v1 request it made."""
    count = page.evaluate("() => window.__requests.length")
    page.fill("#pg-input", text)
    page.press("#pg-input", "Enter")
    page.wait_for_function(f"() => window.__requests.length === {count + 1}")
    return dict(page.evaluate("() => window.__requests.at(-1)"))


def push(page: Any, data: bytes) -> None:
    page.evaluate("(bytes) => window.__requests.at(-1).push(bytes)", list(data))


def end(page: Any) -> None:
    page.evaluate("() => window.__requests.at(-1).end()")


def idle(page: Any) -> None:
    """Wait until no reply is in flight."""
    page.wait_for_function("() => document.getElementById('pg-stop').disabled")


def reply(page: Any) -> str:
    return str(page.locator("#pg-transcript .msg.assistant").last.text_content())


def transcript(page: Any) -> list[list[str]]:
    return [
        [m["role"], m["text"]]
        for m in page.eval_on_selector_all(
            "#pg-transcript .msg",
            "ms => ms.map(m => ({role: m.classList[1], text: m.textContent}))",
        )
    ]


def assert_inert(page: Any) -> None:
    assert page.evaluate("() => [window.__xss, document.querySelectorAll('main img').length]") == [None, 0]


def test_it_joins_events_cut_mid_line_and_mid_character_and_shows_output_as_text(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    page = open_playground(browser, server)
    send(page, "hi")
    first = delta("h\u00e9llo \U0001f600 ")
    data = first + delta(HOSTILE) + event("[DONE]")
    # Inside a two-byte and a four-byte character, between the two newlines, inside "data:".
    cuts = [first.index("\u00e9".encode()) + 1, first.index("\U0001f600".encode()) + 2, len(first) - 1]
    for start, stop in zip([0, *cuts, len(first) + 3], [*cuts, len(first) + 3, len(data)], strict=True):
        push(page, data[start:stop])
    end(page)
    idle(page)
    assert reply(page) == "h\u00e9llo \U0001f600 " + HOSTILE
    assert page.inner_text("#pg-error") == ""
    assert_inert(page)


def test_an_error_event_mid_reply_is_shown_and_the_failed_turn_can_be_retried(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    page = open_playground(browser, server)
    send(page, "first")
    push(page, delta("partial"))
    page.wait_for_function("() => document.querySelector('.msg.assistant').textContent === 'partial'")
    page.fill("#pg-input", "typed while streaming")
    page.press("#pg-input", "Enter")  # ignored: a reply is streaming
    assert page.evaluate("() => window.__requests.length") == 1
    page.fill("#pg-input", "")
    # The gateway's error event in place of [DONE] when the engine fails mid-reply.
    failure = {"error": {"message": "engine died " + HOSTILE, "type": "server_error", "code": None}}
    push(page, event(failure))
    end(page)
    idle(page)
    assert page.inner_text("#pg-error") == "engine died " + HOSTILE
    assert transcript(page) == []  # the failed turn is not part of the conversation...
    assert page.input_value("#pg-input") == "first"  # ...and Send retries it
    assert_inert(page)

    page.press("#pg-input", "Enter")
    page.wait_for_function("() => window.__requests.length === 2")
    assert page.evaluate("() => window.__requests[1].body.messages") == [{"role": "user", "content": "first"}]


def test_a_stream_that_ends_without_done_is_reported_as_cut_off(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    page = open_playground(browser, server)
    send(page, "hi")
    push(page, delta("half a rep"))
    end(page)
    idle(page)
    assert "cut off" in page.inner_text("#pg-error")
    assert transcript(page) == [] and page.input_value("#pg-input") == "hi"


def test_a_rejected_request_says_when_to_retry_and_leaves_no_empty_turn(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    page = open_playground(browser, server)
    message = "Rate limit exceeded: 1 requests per minute."
    limited = {"error": {"message": message, "type": "rate_limit_error"}}
    page.evaluate(
        "(body) => window.__answers.push({status: 429, headers: {'Retry-After': '7'}, body})",
        json.dumps(limited),
    )
    send(page, "hello")
    idle(page)
    assert page.inner_text("#pg-error") == message + " Retry in 7 s."
    assert transcript(page) == [] and page.input_value("#pg-input") == "hello"

    page.press("#pg-input", "Enter")
    page.wait_for_function("() => window.__requests.length === 2")
    push(page, delta("hi there") + event("[DONE]"))
    end(page)
    idle(page)
    assert page.evaluate("() => window.__requests[1].body.messages") == [{"role": "user", "content": "hello"}]
    assert transcript(page) == [["user", "hello"], ["assistant", "hi there"]]
    assert page.inner_text("#pg-error") == ""


def test_a_stopped_reply_stays_in_the_conversation_as_shown(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    page = open_playground(browser, server)
    send(page, "one")
    push(page, delta("par"))
    page.wait_for_function("() => document.querySelector('.msg.assistant').textContent === 'par'")
    page.click("#pg-stop")
    idle(page)
    assert page.evaluate("() => window.__requests[0].aborted") is True
    assert "stopped" in page.inner_text("#pg-stats")
    body = send(page, "two")["body"]
    assert body["messages"] == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "par"},
        {"role": "user", "content": "two"},
    ]


def test_new_chat_mid_reply_starts_the_next_conversation_empty(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    page = open_playground(browser, server)
    send(page, "old topic")
    push(page, delta("old answ"))
    page.wait_for_function("() => document.querySelector('.msg.assistant').textContent === 'old answ'")
    page.click("#pg-clear")
    idle(page)
    assert page.evaluate("() => window.__requests[0].aborted") is True
    body = send(page, "new topic")["body"]
    assert body["messages"] == [{"role": "user", "content": "new topic"}]
    push(page, delta("fresh") + event("[DONE]"))
    end(page)
    idle(page)
    assert transcript(page) == [["user", "new topic"], ["assistant", "fresh"]]


def test_a_revoked_key_is_replaced_and_the_message_sent_again(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    page = sign_in(browser, server.url, "ada", "/playground/")
    secrets: list[str] = []

    def gateway(route: Any) -> None:  # the gateway's key check, against the real database
        secret = route.request.headers["authorization"].removeprefix("Bearer ")
        secrets.append(secret)
        if db_call(authenticate_api_key, secret) is None:
            error = {"error": {"message": "Invalid or revoked API key.", "code": "invalid_api_key"}}
            route.fulfill(status=401, content_type="application/json", body=json.dumps(error))
        else:
            body = delta(f"answer {len(secrets)}") + event("[DONE]")
            route.fulfill(status=200, content_type="text/event-stream", body=body)

    page.route("**/v1/chat/completions", gateway)
    page.fill("#pg-input", "one")
    page.press("#pg-input", "Enter")
    page.wait_for_function("() => document.querySelector('.msg.assistant').textContent === 'answer 1'")
    db_call(lambda: [revoke_api_key(k) for k in ApiKey.objects.filter(name="playground")])
    page.fill("#pg-input", "two")
    page.press("#pg-input", "Enter")
    page.wait_for_function("() => document.querySelectorAll('.msg.assistant')[1]?.textContent === 'answer 3'")
    assert page.inner_text("#pg-error") == ""
    assert secrets[1] == secrets[0] != secrets[2]
    assert db_call(authenticate_api_key, secrets[2]) is not None


def test_a_long_reply_does_not_pull_a_reader_who_scrolled_up_back_down(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    page = open_playground(browser, server)
    send(page, "write a lot")
    for i in range(200):
        push(page, delta(f"line {i}\n"))
    frames = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
    page.wait_for_function("() => document.querySelector('.msg.assistant').textContent.includes('line 199')")
    page.evaluate(frames)
    box = "document.getElementById('pg-transcript')"
    assert page.evaluate(f"() => {box}.scrollHeight - {box}.scrollTop - {box}.clientHeight") < 2  # follows
    page.evaluate(f"() => {{ {box}.scrollTop = 0; }}")  # the reader scrolls up
    page.evaluate(frames)
    push(page, delta("more\n"))
    push(page, delta("x", finish="length") + event("[DONE]"))
    end(page)
    idle(page)
    page.evaluate(frames)
    assert page.evaluate(f"() => {box}.scrollTop") == 0
    assert reply(page).endswith("more\nx")
    assert "max tokens" in page.inner_text("#pg-stats")


def test_enter_that_confirms_an_ime_composition_does_not_send(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    page = open_playground(browser, server)
    page.fill("#pg-input", "\u65e5\u672c")
    left = page.evaluate(
        """() => {
          const input = document.getElementById('pg-input');
          input.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', isComposing: true, bubbles: true}));
          return input.value;
        }"""
    )
    assert left == "\u65e5\u672c" and page.evaluate("() => window.__requests.length") == 0


def test_a_refused_playground_key_is_shown_and_nothing_is_sent(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    """The user's own keys fill their limit: the key endpoint's 409 detail is the page's error."""

    def fill_the_limit() -> None:
        for i in range(settings.API_KEYS_PER_USER):
            create_api_key(users["admin"], f"own-{i}")

    db_call(fill_the_limit)
    page = open_playground(browser, server)
    page.fill("#pg-input", "hello")
    page.press("#pg-input", "Enter")
    page.wait_for_function("() => document.getElementById('pg-error').textContent !== ''")
    idle(page)
    error = page.inner_text("#pg-error")
    assert f"you have {settings.API_KEYS_PER_USER} live API keys" in error
    assert "revoke one on the API keys page (/api-keys/)" in error and "to use the playground" in error
    assert page.evaluate("() => window.__requests.length") == 0
    assert transcript(page) == [] and page.input_value("#pg-input") == "hello"
    assert db_call(lambda: ApiKey.objects.filter(name="playground").count()) == 0
