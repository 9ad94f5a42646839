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
from accounts.models import User
from accounts.services import create_api_key
from deployments.models import Deployment
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
    for user in User.objects.all():
        create_api_key(user, f"{user.username}-key")
    return {"model": model.pk, "deployment": deployment.pk, "done": done.pk, "place": place.pk}


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
        Page("/api-keys/"),
        Page(f"/deployments/{deployment}/logs/", live=True),
        Page("/playground/"),
        Page("/accounts/password_change/"),
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


def visit(page: Any, problems: Problems, target: Page) -> list[str]:
    """What went wrong on the page: problems, a status other than 200, no heading, never live."""
    response = page.goto(target.path, wait_until="load")
    found = (
        []
        if response is not None and response.status == 200
        else [f"answered {response and response.status}"]
    )
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
    return found + problems.take()


@pytest.mark.parametrize("who", ["ada", "vic"])
def test_every_page_loads_clean_for_each_role(
    users: dict[str, User], server: AsgiServer, browser: Any, who: str
) -> None:
    ids = db_call(make_world)
    page = sign_in(browser, server.url, who)
    problems = Problems()
    problems.watch(page)
    found = {t.path: visit(page, problems, t) for t in pages(ids) if who == "ada" or not t.admin_only}
    assert {path: seen for path, seen in found.items() if seen} == {}


def test_the_sign_in_page_loads_clean(users: dict[str, User], server: AsgiServer, browser: Any) -> None:
    page = browser.new_context(base_url=server.url).new_page()
    problems = Problems()
    problems.watch(page)
    assert visit(page, problems, Page("/accounts/login/?next=/jobs/")) == []
