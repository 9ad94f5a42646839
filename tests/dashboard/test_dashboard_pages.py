"""Dashboard pages: sign-in, local plotly.js, registry forms with the API's validation, roles."""

from __future__ import annotations

import html
import json
import logging
import re
from datetime import timedelta
from typing import Any

import pytest
from accounts.models import User
from dashboard.assets import PLOTLY_JS, PLOTLY_VERSION
from deployments.models import Deployment, ObservedState
from django.test import Client
from django.utils import timezone
from gateway.models import RequestSample
from inventory.models import Device, Host
from jobs.models import Job, JobStatus
from registry.api.serializers import ServedModelSerializer
from registry.models import ServedModel

from tests.dashboard.helpers import GIB, add_device_sample, add_engine_sample

pytestmark = pytest.mark.django_db

FORM = {
    "name": "llama-3-8b",
    "source": "meta-llama/Meta-Llama-3-8B-Instruct",
    "dtype": "bfloat16",
    "tensor_parallel_size": "2",
    "max_context_length": "8192",
    "slo_ttft_p99_ms": "500",
    "slo_tbt_p99_ms": "50",
    "slo_attainment_pct": "90",
    "engine_options": '{"gpu_memory_utilization": 0.9}',
}


def test_it_sends_anonymous_visitors_to_the_login_page() -> None:
    for url in ("/", "/models/", "/jobs/", "/models/new/"):
        response = Client().get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), url


def test_it_serves_plotly_from_the_app_and_pages_reference_that_local_url(
    viewer_client: Client, served_model: ServedModel
) -> None:
    page = viewer_client.get(f"/models/{served_model.pk}/").content.decode()
    scripts = re.findall(r'<script src="([^"]+)"', page)
    local = f"/assets/plotly-{PLOTLY_VERSION}.min.js"
    assert local in scripts
    assert all(src.startswith("/") for src in scripts), scripts  # nothing from another site
    response = Client().get(local)
    assert response.status_code == 200
    assert "immutable" in response["Cache-Control"]
    assert b"".join(response.streaming_content) == PLOTLY_JS.read_bytes()  # type: ignore[attr-defined]
    assert Client().get("/assets/plotly-0.0.1.min.js").status_code == 404


def test_it_shows_each_gpu_with_role_memory_pairing_status_and_simulated_badge(
    viewer_client: Client, host: Host
) -> None:
    d0, d1 = Device.objects.filter(host=host).order_by("index")
    add_device_sample(d0, aqua_role="producer", lent_bytes=20 * GIB, paired_with=1)
    add_device_sample(d1, aqua_role="consumer", borrowed_bytes=20 * GIB, paired_with=0)
    page = viewer_client.get("/")
    snapshot = json.loads(re.search(rb'id="overview-snapshot"[^>]*>(.*?)</script>', page.content, re.S)[1])  # type: ignore[index]
    assert snapshot[f"host:{host.pk}"] == {
        "name": "sim-a",
        "status": host.status,
        "simulated": True,
        "last_seen": None,
    }
    assert snapshot[f"device:{d0.pk}"]["role"] == "producer"
    assert snapshot[f"device:{d0.pk}"]["lent"] == 20 * GIB
    assert snapshot[f"device:{d1.pk}"]["borrowed"] == 20 * GIB
    assert snapshot[f"device:{d1.pk}"]["paired_with"] == 0


def test_it_registers_a_model_through_the_form(admin_client: Client) -> None:
    response = admin_client.post("/models/new/", FORM)
    model = ServedModel.objects.get(name="llama-3-8b")
    assert response.status_code == 302 and response["Location"] == f"/models/{model.pk}/"
    assert (model.tensor_parallel_size, model.max_context_length, model.dtype) == (2, 8192, "bfloat16")
    assert model.engine_options == {"gpu_memory_utilization": 0.9}


@pytest.mark.parametrize(
    "change",
    [
        {"tensor_parallel_size": "3"},
        {"slo_ttft_p99_ms": "-1"},
        {"name": "not a slug!"},
        {"engine_options": '{"not-an-identifier": 1}'},
        {"source": "   "},
    ],
)
def test_it_refuses_bad_input_with_the_apis_own_field_errors(
    admin_client: Client, change: dict[str, str]
) -> None:
    form = {**FORM, **change}
    response = admin_client.post("/models/new/", form)
    assert response.status_code == 400
    assert not ServedModel.objects.exists()
    field = next(iter(change))
    payload: dict[str, Any] = {k: v for k, v in form.items() if k != "engine_options"}
    payload["engine_options"] = json.loads(form["engine_options"])
    api = ServedModelSerializer(data=payload)
    assert not api.is_valid()
    page = response.content.decode()
    for message in api.errors[field]:
        assert f'data-field="{field}">{message}' in html.unescape(page)


def test_it_says_so_when_engine_options_are_not_json(admin_client: Client) -> None:
    response = admin_client.post("/models/new/", {**FORM, "engine_options": "{oops"})
    assert response.status_code == 400 and b"Not valid JSON" in response.content
    assert not ServedModel.objects.exists()


def test_it_edits_a_model(admin_client: Client, served_model: ServedModel) -> None:
    response = admin_client.post(
        f"/models/{served_model.pk}/edit/", {**FORM, "name": "tiny", "slo_ttft_p99_ms": "750"}
    )
    assert response.status_code == 302
    served_model.refresh_from_db()
    assert served_model.slo_ttft_p99_ms == 750.0 and served_model.tensor_parallel_size == 2


def test_it_starts_a_job_with_validated_params(admin_client: Client) -> None:
    response = admin_client.post("/jobs/start/", {"kind": "noop", "params": '{"steps": 3}'})
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert job.params["steps"] == 3 and job.status == JobStatus.QUEUED
    bad = admin_client.post("/jobs/start/", {"kind": "noop", "params": '{"steps": 0}'})
    assert bad.status_code == 400 and b'data-field="params"' in bad.content
    unknown = admin_client.post("/jobs/start/", {"kind": "bogus", "params": ""})
    assert unknown.status_code == 400 and b"Unknown job kind" in unknown.content
    assert Job.objects.count() == 1


def test_a_jobs_parameters_are_shown_as_json_the_job_form_takes_back(admin_client: Client) -> None:
    params = {"model": "tiny", "apply": True, "rates": [0.5, None]}
    job = Job.objects.create(kind="profile", params=params, status=JobStatus.SUCCEEDED)
    page = html.unescape(admin_client.get(f"/jobs/{job.pk}/").content.decode())
    shown = re.search(r'<code id="shown-params">(.*?)</code>', page)
    assert shown is not None and json.loads(shown.group(1)) == params  # not Python's repr
    listing = html.unescape(admin_client.get("/jobs/").content.decode())
    assert '"required": true' in listing and "'required'" not in listing  # the kinds' parameters


def test_viewers_see_no_admin_action_and_are_refused_when_forcing_one(
    viewer_client: Client, admin_client: Client, served_model: ServedModel
) -> None:
    job = Job.objects.create(kind="place", status=JobStatus.SUCCEEDED)
    for url in ("/models/", f"/models/{served_model.pk}/", "/jobs/", f"/jobs/{job.pk}/"):
        page = viewer_client.get(url)
        assert page.status_code == 200
        assert b"admin-action" not in page.content, url
    assert b"admin-action" in admin_client.get("/models/").content
    assert b"admin-action" in admin_client.get("/jobs/").content
    refused = [
        viewer_client.get("/models/new/"),
        viewer_client.post("/models/new/", FORM),
        viewer_client.post(f"/models/{served_model.pk}/edit/", {**FORM, "slo_ttft_p99_ms": "1"}),
        viewer_client.post("/jobs/start/", {"kind": "noop"}),
        viewer_client.post(f"/jobs/{job.pk}/apply/"),
    ]
    assert [r.status_code for r in refused] == [403] * 5
    served_model.refresh_from_db()
    assert served_model.slo_ttft_p99_ms == 500.0
    assert not ServedModel.objects.filter(name="llama-3-8b").exists()
    assert Job.objects.count() == 1


def test_it_shows_history_and_attainment_on_the_model_page(
    viewer_client: Client, deployment: Deployment
) -> None:
    now = timezone.now()
    add_engine_sample(deployment, now - timedelta(seconds=3))
    add_engine_sample(deployment, now - timedelta(seconds=2))
    add_engine_sample(deployment, now - timedelta(seconds=1), ttft_p99=0.9)  # misses the 500 ms SLO
    page = viewer_client.get(f"/models/{deployment.model_id}/").content.decode()
    history = json.loads(re.search(r'id="model-history"[^>]*>(.*?)</script>', page, re.S)[1])  # type: ignore[index]
    points = history[str(deployment.pk)]
    assert [p["ttft_p99"] for p in points] == [0.3, 0.3, 0.9]
    assert points[1]["rate"] == pytest.approx(10.0, rel=0.01)  # 10 first tokens in a 1 s window
    assert "66.7%" in page


@pytest.mark.parametrize("attainment", [{"slo_attainment_pct": ""}, {}])  # blank, or left out
def test_an_edit_with_emptied_optional_fields_sets_their_defaults_and_awaits_the_restart(
    admin_client: Client, viewer_client: Client, deployment: Deployment, attainment: dict[str, str]
) -> None:
    model = deployment.model
    ServedModel.objects.filter(pk=model.pk).update(engine_options={"seed": 0}, slo_attainment_pct=99.0)
    Deployment.objects.filter(pk=deployment.pk).update(observed_state=ObservedState.RUNNING)
    form = {
        "name": model.name,
        "source": model.source,
        "dtype": model.dtype,
        "tensor_parallel_size": "1",
        "max_context_length": "256",
        "slo_ttft_p99_ms": "500",
        "slo_tbt_p99_ms": "50",
        "engine_options": "",
        **attainment,
    }
    assert viewer_client.post(f"/models/{model.pk}/edit/", form).status_code == 403
    model.refresh_from_db()
    assert (model.engine_options, model.slo_attainment_pct) == ({"seed": 0}, 99.0)
    response = admin_client.post(f"/models/{model.pk}/edit/", form)
    assert response.status_code == 302, response.content
    model.refresh_from_db()
    assert model.engine_options == {} and model.slo_attainment_pct == 90.0
    # through registry.services.update_served_model, as an API edit: the running engine restarts
    deployment.refresh_from_db()
    assert deployment.observed_state == ObservedState.PENDING
    assert deployment.observed_message.startswith("model settings changed (engine_options)")
    assert deployment.restart_from is not None
    assert deployment.restart_from["model"]["engine_options"] == {"seed": 0}


def test_pages_name_their_icon_so_browsers_do_not_ask_for_a_missing_favicon(admin_client: Client) -> None:
    # Without a <link rel="icon">, browsers fetch /favicon.ico: a 404 in every page's console.
    assert admin_client.get("/favicon.ico").status_code == 404
    for page in (Client().get("/accounts/login/"), admin_client.get("/")):
        assert page.status_code == 200 and '<link rel="icon" href="data:,">' in page.content.decode()


def test_the_model_page_shows_what_users_saw_through_the_gateway(
    admin_client: Client, served_model: ServedModel
) -> None:
    # The engine's charts start at the engine; the gateway's timings include its front end too.
    page = admin_client.get(f"/models/{served_model.pk}/").content.decode()
    assert "No requests through the gateway in the last 10 minutes." in page
    for ttft, gap in ((0.1, 0.01), (0.2, 0.02), (0.3, 0.5)):
        RequestSample.objects.create(
            model=served_model,
            ts=timezone.now(),
            stream=True,
            outcome="completed",
            ttft_s=ttft,
            tbt_mean_s=gap,
            tbt_max_s=gap * 2,
        )
    page = admin_client.get(f"/models/{served_model.pk}/").content.decode()
    block = page[page.index('id="gateway-latency"') :]
    assert '<dt>Requests</dt><dd id="gateway-requests">3</dd>' in block  # none failed
    assert "over the 3 requests that got a first token" in block
    assert "200.0 / 298.0 ms" in block  # TTFT p50 / p99 (interpolated)
    assert "980.8 ms" in block  # p99 of the largest gaps (0.02, 0.04, 1.0 s)


def test_a_refusal_says_why_on_a_page_with_the_navigation(
    viewer_client: Client, served_model: ServedModel
) -> None:
    for url in ("/models/new/", f"/models/{served_model.pk}/edit/"):
        response = viewer_client.get(url)
        assert response.status_code == 403, url
        page = response.content.decode()
        assert 'id="forbidden-reason">This action needs the admin role.</p>' in page, url
        assert 'href="/models/"' in page and "Sign out" in page  # not a dead end


def test_a_viewers_refused_write_is_logged_in_one_line_without_a_traceback(
    viewer_client: Client, served_model: ServedModel, caplog: pytest.LogCaptureFixture
) -> None:
    """A raised PermissionDenied was logged with its traceback, some 40 lines per refused click."""
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = viewer_client.post(f"/models/{served_model.pk}/delete/")
    assert response.status_code == 403
    assert 'id="forbidden-reason">This action needs the admin role.</p>' in response.content.decode()
    refusals = [r for r in caplog.records if r.name == "django.request"]
    assert [r.getMessage() for r in refusals] == [f"Forbidden: /models/{served_model.pk}/delete/"]
    assert refusals[0].exc_info is None


def test_users_change_their_password_on_a_page_of_the_platform(
    viewer_client: Client, viewer_user: User
) -> None:
    # /accounts/password_change/ rendered the admin's template ("Django administration") for users
    # who may not use the admin; the dashboard did not link to it.
    assert 'href="/accounts/password_change/"' in viewer_client.get("/").content.decode()
    page = viewer_client.get("/accounts/password_change/").content.decode()
    assert "Django administration" not in page and "<h1>Change password</h1>" in page
    assert '<link rel="icon" href="data:,">' in page
    wrong = viewer_client.post(
        "/accounts/password_change/",
        {"old_password": "not-it", "new_password1": "Fresh-pass-77x", "new_password2": "Fresh-pass-77x"},
    )
    assert wrong.status_code == 200 and "Your old password was entered incorrectly" in wrong.content.decode()
    done = viewer_client.post(
        "/accounts/password_change/",
        {
            "old_password": f"{viewer_user.username}-pw-9f2k",
            "new_password1": "Fresh-pass-77x",
            "new_password2": "Fresh-pass-77x",
        },
        follow=True,
    )
    assert done.redirect_chain[-1][0] == "/accounts/password_change/done/"
    assert "<h1>Password changed</h1>" in done.content.decode()
    viewer_user.refresh_from_db()
    assert viewer_user.check_password("Fresh-pass-77x")
    assert viewer_client.get("/").status_code == 200  # still signed in
