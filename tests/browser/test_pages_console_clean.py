"""Every page the dashboard and the playground serve, in headless Chromium, for an admin and a
viewer: no script error, no console error, no failed subresource or refused socket, its heading
shown; and every form on them, posted empty and with a too-long value, answers with a field error
(a 400, or the form again with the error), never a 500 or a blank page.

The pages come from the URL confs (config/urls.py, dashboard/urls.py, gateway/urls.py); the data is
small: a host with two GPUs, a model deployed on one, a finished noop job, a place job with its plan,
an API key per user. There is no page per host or GPU: the overview is the GPU map.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from accounts.models import ApiKey, User
from accounts.services import create_api_key
from deployments.models import Deployment, DesiredState
from django.utils import timezone
from inventory.models import Device, DeviceKind
from inventory.services import register_host
from jobs.models import Job, JobStatus
from planning.models import PlacementPlan
from playwright.sync_api import Error as PlaywrightError
from registry.models import ServedModel

from tests.browser.conftest import db_call, sign_in
from tests.dashboard.helpers import GIB, add_device_sample, add_engine_sample
from tests.fleet.servers import AsgiServer

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TOO_LONG = "9" * 3000  # digits: also a value for a number field, too long (or too large) for any


@dataclass(frozen=True)
class Page:
    path: str
    heading: str = "h1"  # the selector of its main heading
    admin_only: bool = False
    live: bool = False  # opens a socket: the page is checked once it is live
    status: int = 200  # a refusal page: Chromium logs its own status as a failed resource


def make_world() -> dict[str, int]:
    host = register_host("gpu-h", "127.0.0.1")
    gpus = [
        Device.objects.create(
            host=host,
            index=i,
            uuid=f"GPU-h-{i}",
            name="H100",
            kind=DeviceKind.GPU,
            memory_total_bytes=80 * GIB,
        )
        for i in range(2)
    ]
    for gpu in gpus:
        add_device_sample(gpu)
    model = ServedModel.objects.create(
        name="tiny", source="org/tiny", max_context_length=256, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
    )
    deployment = Deployment.objects.create(model=model, host=host)
    deployment.devices.set([gpus[0]])
    add_engine_sample(deployment, timezone.now())
    done = Job.objects.create(
        kind="noop", params={"steps": 2}, status=JobStatus.SUCCEEDED, progress=1.0, result={"steps_done": 2}
    )
    place = Job.objects.create(kind="place", status=JobStatus.SUCCEEDED, progress=1.0, result={})
    plan = {
        "servers": [{"name": "gpu-h", "num_gpus": 2}],
        "assignments": [{"model": "tiny", "server": "gpu-h", "gpus": [1]}],
    }
    move = {"kind": "move", "model": "tiny", "from_server": "gpu-h", "from_gpus": [0]}
    moves = [{**move, "to_server": "gpu-h", "to_gpus": [1]}]
    PlacementPlan.objects.create(job=place, plan=plan, moves=moves, fingerprint="x")
    curve = [{"rate": r, "ttft_p99_s": 0.1 * r, "tbt_p99_s": 0.01 * r} for r in (1.0, 2.0, 4.0)]
    sla = {"ttft_p99_s": 0.5, "tbt_p99_s": 0.05}
    profile = Job.objects.create(
        kind="profile",
        params={"model": "tiny"},
        status=JobStatus.SUCCEEDED,
        progress=1.0,
        result={"curve": curve, "sla": sla, "max_rps": 2.0, "role": "producer", "capped": False},
    )
    running = Job.objects.create(
        kind="noop", status=JobStatus.RUNNING, progress=0.5, heartbeat_at=timezone.now()
    )
    stopped = Deployment.objects.create(model=model, host=host, desired_state=DesiredState.STOPPED)
    stopped.devices.set([gpus[1]])
    for user in User.objects.all():
        create_api_key(user, f"{user.username}-key")
    return {
        "model": model.pk,
        "deployment": deployment.pk,
        "stopped": stopped.pk,
        "done": done.pk,
        "place": place.pk,
        "profile": profile.pk,
        "running": running.pk,
    }


def pages(ids: dict[str, int]) -> list[Page]:
    model, deployment = ids["model"], ids["deployment"]
    return [
        Page("/", live=True),
        Page("/models/"),
        Page("/models/new/", admin_only=True),
        Page(f"/models/{model}/", live=True),
        Page(f"/models/{model}/edit/", admin_only=True),
        Page("/jobs/", live=True),
        Page(f"/jobs/{ids['done']}/", live=True),
        Page(f"/jobs/{ids['place']}/", live=True),
        Page(f"/jobs/{ids['profile']}/", live=True),
        Page(f"/jobs/{ids['running']}/", live=True),
        Page("/jobs/?page=9", status=404),
        Page("/models/999/", status=404),
        Page("/api-keys/"),
        Page(f"/deployments/{deployment}/logs/", live=True),
        Page(f"/deployments/{ids['stopped']}/logs/", live=True),
        Page("/playground/"),
        Page("/accounts/password_change/"),
        Page("/accounts/password_change/done/"),
        Page("/api/docs/"),  # Swagger UI draws its h1 from the schema
    ]


@dataclass
class Problems:
    """What went wrong on a page: script errors, console errors, failed requests and sockets."""

    seen: list[str] = field(default_factory=list)

    def watch(self, page: Any) -> None:
        page.on("pageerror", lambda e: self.seen.append(f"pageerror: {e}"))
        page.on("console", lambda m: self.seen.append(f"console: {m.text}") if m.type == "error" else None)
        page.on("requestfailed", lambda r: self.seen.append(f"failed: {r.url} {r.failure}"))
        page.on("response", self._response)
        page.on("websocket", lambda ws: ws.on("socketerror", lambda e: self.seen.append(f"socket: {e}")))

    def _response(self, response: Any) -> None:
        if response.status >= 400 and not response.request.is_navigation_request():
            self.seen.append(f"status {response.status}: {response.url}")

    def take(self) -> list[str]:
        out, self.seen[:] = list(self.seen), []
        return out


def without_own_refusal(seen: list[str], status: int | None) -> list[str]:
    """``seen`` less the one line Chromium logs for a page answered with an error ``status`` (a
    refusal page: 403, 404, 405; a refused form's 400), which is no failure of the page itself."""
    own = f"console: Failed to load resource: the server responded with a status of {status} ("
    first = next((i for i, line in enumerate(seen) if status is not None and line.startswith(own)), None)
    return [line for i, line in enumerate(seen) if i != first]


def visit(page: Any, problems: Problems, target: Page) -> list[str]:
    """What went wrong on the page: problems, another status than its own, no heading, never live."""
    try:
        response = page.goto(target.path, wait_until="load")
    except PlaywrightError as exc:  # e.g. an empty error answer: the browser's own error page
        return [f"not shown: {exc.message.splitlines()[0]}"]
    status = response.status if response is not None else None
    found = [] if status == target.status else [f"answered {status}"]
    if target.live:
        try:
            page.wait_for_selector("#live-status[data-state=live]", timeout=10_000)
        except PlaywrightError:
            found.append("never live")
    page.wait_for_load_state("networkidle")
    heading = page.locator(target.heading).first
    try:
        heading.wait_for(timeout=10_000)
        if not heading.inner_text().strip():
            found.append("empty heading")
    except PlaywrightError:
        found.append(f"no heading {target.heading}")
    return found + without_own_refusal(problems.take(), status if target.status != 200 else None)


@pytest.mark.parametrize("who", ["ada", "vic"])
def test_every_page_loads_clean_for_each_role(
    users: dict[str, User], server: AsgiServer, browser: Any, who: str
) -> None:
    ids = db_call(make_world)
    page = sign_in(browser, server.url, who)
    problems = Problems()
    problems.watch(page)
    shown = [t if who == "ada" or not t.admin_only else Page(t.path, status=403) for t in pages(ids)]
    found = {t.path: visit(page, problems, t) for t in shown}
    assert {path: seen for path, seen in found.items() if seen} == {}


def test_the_sign_in_page_loads_clean(users: dict[str, User], server: AsgiServer, browser: Any) -> None:
    page = browser.new_context(base_url=server.url).new_page()
    problems = Problems()
    problems.watch(page)
    assert visit(page, problems, Page("/accounts/login/?next=/jobs/")) == []


@dataclass(frozen=True)
class Form:
    path: str
    selector: str
    admin_only: bool = False
    choose: dict[str, str] = field(default_factory=dict)  # select name -> option value to pick


# A form's answer shows an error here: the dashboard's field errors, Django's error lists, alerts.
ERRORS = ".field-error, .errorlist li, [role=alert]"
# Fills every visible input and textarea of the form with ``value``, picks the ``choose`` options,
# and turns off the browser's own checks (required, maxlength, number): the server's are tested.
FILL = """([selector, value, choose]) => {
  const form = document.querySelector(selector);
  form.noValidate = true;
  for (const el of form.querySelectorAll("input:not([type=hidden]):not([type=submit]), textarea")) {
    el.removeAttribute("maxlength");
    el.value = value;
  }
  for (const [name, option] of Object.entries(choose)) form.elements[name].value = option;
}"""


def forms(ids: dict[str, int]) -> list[Form]:
    model = ids["model"]
    return [
        Form("/models/new/", "#model-form", admin_only=True),
        Form(f"/models/{model}/edit/", "#model-form", admin_only=True),
        Form(f"/models/{model}/", "#deploy-form", admin_only=True),
        # Empty parameters are the defaults of a kind; profile's name a model, which is required.
        Form("/jobs/", "#job-form", admin_only=True, choose={"kind": "profile"}),
        Form("/api-keys/", "#key-form"),
        Form("/accounts/password_change/", "#password-form"),
    ]


def rows() -> tuple[int, int, int, int]:
    return (
        ServedModel.objects.count(),
        Deployment.objects.count(),
        Job.objects.count(),
        ApiKey.objects.count(),
    )


def submit(page: Any, problems: Problems, form: Form, value: str) -> list[str]:
    """What went wrong posting ``form`` with every field set to ``value``: an answer of 500 (or any
    5xx, or a 403), no heading, no error shown, or the page's problems."""
    page.goto(form.path, wait_until="load")
    page.evaluate(FILL, [form.selector, value, form.choose])
    with page.expect_navigation() as navigation:
        page.click(f"{form.selector} [type=submit]")
    response = navigation.value
    page.wait_for_load_state("networkidle")
    status = response.status if response is not None else None
    found = [] if status is not None and status < 500 and status != 403 else [f"answered {status}"]
    if not page.locator("h1").first.inner_text().strip():
        found.append("no heading")
    shown = [t.strip() for t in page.locator(ERRORS).all_inner_texts() if t.strip()]
    if not shown:
        found.append("no error shown")
    return found + without_own_refusal(problems.take(), status if status == 400 else None)


@pytest.mark.parametrize("who", ["ada", "vic"])
def test_every_form_refuses_empty_and_too_long_values_with_a_field_error(
    users: dict[str, User], server: AsgiServer, browser: Any, who: str
) -> None:
    ids = db_call(make_world)
    before = db_call(rows)
    page = sign_in(browser, server.url, who)
    problems = Problems()
    problems.watch(page)
    found = {
        (form.path, form.selector, kind): submit(page, problems, form, value)
        for form in forms(ids)
        if who == "ada" or not form.admin_only
        for kind, value in (("empty", ""), ("too long", TOO_LONG))
    }
    assert {case: seen for case, seen in found.items() if seen} == {}
    assert db_call(rows) == before  # nothing was created


@pytest.mark.parametrize("value", ["", TOO_LONG])
def test_the_sign_in_form_refuses_empty_and_too_long_values(
    users: dict[str, User], server: AsgiServer, browser: Any, value: str
) -> None:
    page = browser.new_context(base_url=server.url).new_page()
    problems = Problems()
    problems.watch(page)
    assert submit(page, problems, Form("/accounts/login/", "form"), value) == []


@pytest.mark.parametrize(
    ("box", "value"),
    [
        ("#pg-max-tokens", ""),  # was sent as 0 (Number("")): the gateway's "'max_tokens' must be ..."
        ("#pg-max-tokens", TOO_LONG),  # no number the input holds: empty, as above
        ("#pg-max-tokens", "2.5"),
        ("#pg-temperature", ""),  # was sent as 0: a greedy reply, not what was asked
        ("#pg-temperature", TOO_LONG),
        ("#pg-temperature", "3"),
    ],
)
def test_the_playground_refuses_a_bad_number_on_its_field_and_sends_nothing(
    users: dict[str, User], server: AsgiServer, browser: Any, box: str, value: str
) -> None:
    # The chat form posts no page: its script sends /v1 requests, and must not send this one. The
    # browser's own checks refuse it (the form is not submitted), with the field's message.
    db_call(make_world)
    page = sign_in(browser, server.url, "vic", "/playground/")
    problems = Problems()
    problems.watch(page)
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if "/v1/" in r.url else None)
    page.evaluate("([box, value]) => { document.querySelector(box).value = value; }", [box, value])
    page.fill("#pg-input", "hello")
    page.press("#pg-input", "Enter")
    page.wait_for_load_state("networkidle")
    assert page.locator(box).evaluate("el => el.validationMessage") != ""
    assert page.input_value("#pg-input") == "hello"  # kept, to send once the number is fixed
    assert (sent, page.locator("#pg-transcript").inner_text(), problems.take()) == ([], "", [])


# Forms of a button alone (stop, start, delete, cancel, apply, revoke), in the page's content.
BUTTON_FORMS = "main form:not(:has(input:not([type=hidden]), textarea, select))"


def test_every_button_form_answers_with_a_page_never_a_500(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    # Each is pressed once, in page order, on what the earlier ones left: some succeed (a redirect
    # to the page with a notice), others are refused (the page with the reason, 400/404/409).
    ids = db_call(make_world)
    page = sign_in(browser, server.url, "ada")
    problems = Problems()
    problems.watch(page)
    found: dict[str, list[str]] = {}
    for target in pages(ids):
        page.goto(target.path, wait_until="load")
        actions = page.locator(BUTTON_FORMS).evaluate_all("fs => fs.map(f => f.getAttribute('action'))")
        problems.take()
        for action in actions:
            page.goto(target.path, wait_until="load")
            form = page.locator(f'{BUTTON_FORMS}[action="{action}"]')
            if form.count() == 0:  # gone after an earlier press (a deleted deployment's Start)
                continue
            with page.expect_navigation() as navigation:
                form.locator("[type=submit]").click()
            response = navigation.value
            page.wait_for_load_state("networkidle")
            status = response.status if response is not None else None
            seen = [] if status is not None and status < 500 and status != 403 else [f"answered {status}"]
            if not page.locator("h1").first.inner_text().strip():
                seen.append("no heading")
            seen += without_own_refusal(problems.take(), status if status and status >= 400 else None)
            found[f"{target.path} {action} ({status})"] = seen
    assert len(found) >= 6, found  # stop, start, delete, delete model, apply, cancel, revoke
    assert {case: seen for case, seen in found.items() if seen} == {}


def test_the_playground_with_no_model_deployed_sends_nothing(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    # It was sent with "model": "", for the gateway's 400 ("'model' is required ...") to be shown.
    page = sign_in(browser, server.url, "vic", "/playground/")
    problems = Problems()
    problems.watch(page)
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if "/v1/" in r.url else None)
    assert page.locator("p.empty").inner_text() == "No model is deployed yet."
    page.fill("#pg-input", "hello")
    page.press("#pg-input", "Enter")
    page.wait_for_load_state("networkidle")
    assert page.locator("#pg-model").evaluate("el => el.validationMessage") != ""
    assert (sent, page.input_value("#pg-input"), problems.take()) == ([], "hello", [])


def test_the_sign_out_address_opened_in_the_browser_shows_a_page(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    # Signing out is a POST; a GET (a bookmark, a typed address) was an empty 405, which Chromium
    # shows as its own error page (net::ERR_HTTP_RESPONSE_CODE_FAILURE).
    page = sign_in(browser, server.url, "vic")
    problems = Problems()
    problems.watch(page)
    assert visit(page, problems, Page("/accounts/logout/")) == []
    assert page.locator("h1").inner_text() == "Sign out"
    with page.expect_navigation():
        page.click("button[type=submit]")
    assert page.url == f"{server.url}/accounts/login/"
    assert page.goto("/").url == f"{server.url}/accounts/login/?next=/"  # signed out
    # Signed out already: the sign-in page.
    assert visit(page, problems, Page("/accounts/logout/")) == []
    assert page.url == f"{server.url}/accounts/login/"


def test_a_form_address_opened_in_the_browser_shows_a_page(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    # A refused form is shown at the address it was posted to (/jobs/start/, /api-keys/new/, ...):
    # Enter in the address bar there, or a bookmark, is a GET, which these refuse with a 405. It
    # had no body: Chromium showed its own error page (net::ERR_HTTP_RESPONSE_CODE_FAILURE).
    ids = db_call(make_world)
    model, deployment, job = ids["model"], ids["deployment"], ids["running"]
    posts_only = [
        "/jobs/start/",
        f"/jobs/{job}/cancel/",
        f"/jobs/{ids['place']}/apply/",
        f"/models/{model}/deploy/",
        f"/models/{model}/delete/",
        f"/deployments/{deployment}/stop/",
        f"/deployments/{deployment}/start/",
        f"/deployments/{deployment}/delete/",
        "/api-keys/new/",
        "/api-keys/1/revoke/",
        "/playground/key/",
    ]
    page = sign_in(browser, server.url, "ada")
    problems = Problems()
    problems.watch(page)
    found = {path: visit(page, problems, Page(path, status=405)) for path in posts_only}
    assert {path: seen for path, seen in found.items() if seen} == {}
    assert page.locator("a#back").get_attribute("href") == "/"
