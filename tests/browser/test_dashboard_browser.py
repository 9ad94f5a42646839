"""The dashboard in headless Chromium against real daphne, a simulated GPU agent and a Celery worker."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from accounts.models import User
from deployments.models import Deployment
from django.utils import timezone
from inventory.models import Device, DeviceKind, Host
from inventory.services import issue_agent_token, register_host
from jobs.models import Job, JobStatus
from registry.models import ServedModel

from tests.browser.conftest import db_call, screenshot, sign_in
from tests.control_plane.worker import CeleryWorker
from tests.dashboard.helpers import GIB, add_engine_sample
from tests.fleet.servers import AgentProcess, AsgiServer, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _deploy_with_a_sample(model: ServedModel) -> Deployment:
    host = register_host("gpu-h", "127.0.0.1")
    device = Device.objects.create(
        host=host, index=0, uuid="GPU-h-0", name="H100", kind=DeviceKind.GPU, memory_total_bytes=80 * GIB
    )
    deployment = Deployment.objects.create(model=model, host=host)
    deployment.devices.set([device])
    add_engine_sample(deployment, timezone.now() - timedelta(seconds=1))
    return deployment


def _card_times(page: Any) -> list[str]:
    return list(
        page.eval_on_selector_all("section[data-host=sim-1] .card", "cs => cs.map(c => c.dataset.ts)")
    )


def test_an_admin_watches_gpus_registers_a_model_and_runs_a_job(
    users: dict[str, User], server: AsgiServer, tmp_path: Path, browser: Any
) -> None:
    host = db_call(register_host, "sim-1", "127.0.0.1")
    token = db_call(lambda: issue_agent_token(host).plaintext)
    agent = AgentProcess(server.url, token, "sim-1", tmp_path / "agent", "--simulate", "8xH100")
    agent.start()
    worker = CeleryWorker()
    try:
        wait_until(
            lambda: db_call(lambda: Device.objects.filter(host=host).count()) == 8,
            60,
            "the agent to register",
        )
        page = sign_in(browser, server.url, "ada")

        # GPU map: eight cards of the simulated host, online, producers and consumers, updating live.
        page.wait_for_selector("#live-status[data-state=live]")
        page.wait_for_function(
            "() => [...document.querySelectorAll('section[data-host=sim-1] .card')]"
            ".filter(c => c.dataset.ts).length === 8"
        )
        section = page.locator("section[data-host=sim-1]")
        assert section.locator(".badge.simulated").inner_text() == "simulated"
        assert section.locator(".badge.status").get_attribute("data-status") == "online"
        roles = page.eval_on_selector_all(
            "section[data-host=sim-1] .card", "cs => cs.map(c => c.dataset.role)"
        )
        assert {"producer", "consumer"} <= set(roles)
        assert "→" in section.locator(".pairings").inner_text()
        before = _card_times(page)
        page.wait_for_function(
            "(before) => [...document.querySelectorAll('section[data-host=sim-1] .card')]"
            ".some((c, i) => c.dataset.ts !== before[i])",
            arg=before,
        )
        assert _card_times(page) != before  # a newer sample arrived over the socket, no reload
        screenshot(page, "dashboard-gpu-map")

        # Register a model through the form.
        page.goto("/models/")
        page.click("#register-model")
        page.fill("input[name=name]", "llama-mini")
        page.fill("input[name=source]", "org/llama-mini")
        page.fill("input[name=tensor_parallel_size]", "3")  # refused: not a power of two
        page.fill("input[name=max_context_length]", "4096")
        page.fill("input[name=slo_ttft_p99_ms]", "400")
        page.fill("input[name=slo_tbt_p99_ms]", "40")
        page.click("#save-model")
        assert (
            "not a power of two"
            in page.locator('.field-error[data-field="tensor_parallel_size"]').inner_text()
        )
        assert not db_call(lambda: ServedModel.objects.filter(name="llama-mini").exists())
        page.fill("input[name=tensor_parallel_size]", "2")
        page.click("#save-model")
        page.wait_for_selector("h1:has-text('llama-mini')")
        model = db_call(lambda: ServedModel.objects.get(name="llama-mini"))
        assert (model.tensor_parallel_size, model.slo_ttft_p99_ms) == (2, 400.0)
        # Its page draws the SLO charts with the app's own plotly.js.
        page.wait_for_function("() => window.Plotly && document.querySelector('#chart-ttft .main-svg')")
        screenshot(page, "dashboard-model-registered")

        # Start a noop job and watch its progress bar reach 100%.
        CeleryWorker.purge_queue()
        db_call(worker.start)
        page.goto("/jobs/")
        page.select_option("#job-kind", "noop")
        page.fill("#job-params", json.dumps({"steps": 10, "delay_s": 0.4}))
        page.click("#start-job")
        page.wait_for_url("**/jobs/*/")
        seen: list[float] = []
        page.expose_function("record", lambda value: seen.append(float(value)))
        page.evaluate(
            "() => { const p = document.querySelector('progress');"
            " setInterval(() => window.record(p.value), 200); }"
        )
        page.wait_for_function(
            "() => document.querySelector('tr[data-job] .status').textContent.startsWith('succeeded')",
            timeout=60_000,
        )
        page.wait_for_function("() => document.querySelector('tr[data-job] .pct').textContent === '100%'")
        assert page.locator("tr[data-job] progress").evaluate("p => p.value") == 1
        assert any(0 < v < 1 for v in seen), seen  # the bar moved through intermediate values
        job = db_call(lambda: Job.objects.get())
        assert (job.status, job.progress) == (JobStatus.SUCCEEDED, 1.0)
        page.wait_for_selector("#job-result")  # the page reloads to show the result
        assert "'steps_done': 10" in page.locator("#job-result").inner_text()
        screenshot(page, "dashboard-job-done")
    finally:
        worker.stop()
        agent.stop()


def test_a_viewer_sees_no_admin_action_and_is_refused_when_forcing_one(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    model = db_call(
        lambda: ServedModel.objects.create(
            name="tiny", source="/m/tiny", max_context_length=256, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
        )
    )
    db_call(lambda: Host.objects.create(name="idle-host"))
    page = sign_in(browser, server.url, "vic", "/models/")
    for path in ("/models/", f"/models/{model.pk}/", "/jobs/", "/"):
        page.goto(path)
        assert page.locator(".admin-action").count() == 0, path
        assert page.locator("body").get_attribute("data-role") == "viewer"
    screenshot(page, "dashboard-viewer")
    statuses = page.evaluate(
        """async (modelId) => {
            const token = document.querySelector('input[name=csrfmiddlewaretoken]').value;
            const post = (url, body) => fetch(url, {method: 'POST', headers: {'X-CSRFToken': token},
                body: new URLSearchParams(body)}).then(r => r.status);
            return [
                await post('/models/new/', {name: 'forced', source: 'x/y', max_context_length: '1',
                    slo_ttft_p99_ms: '1', slo_tbt_p99_ms: '1'}),
                await post('/models/' + modelId + '/edit/', {slo_ttft_p99_ms: '1'}),
                await post('/jobs/start/', {kind: 'noop'}),
                await fetch('/api/v1/jobs/', {method: 'POST', body: JSON.stringify({kind: 'noop'}),
                    headers: {'X-CSRFToken': token, 'Content-Type': 'application/json'}}).then(r => r.status),
            ];
        }""",
        model.pk,
    )
    assert statuses == [403, 403, 403, 403]

    # The model page: history drawn at load, then new engine samples appended live (no reload).
    deployment = db_call(_deploy_with_a_sample, model)
    page.goto(f"/models/{model.pk}/")
    points = "() => document.getElementById('chart-ttft').data?.[0]?.x.length ?? 0"
    page.wait_for_function(f"({points})() === 1")
    db_call(lambda: add_engine_sample(deployment, timezone.now(), ttft_p99=0.9))  # misses the 500 ms SLO
    page.wait_for_function(f"({points})() === 2")
    page.wait_for_function("() => document.getElementById('attainment').textContent === '50.0%'")
    screenshot(page, "dashboard-model-live")
    assert not db_call(lambda: ServedModel.objects.filter(name="forced").exists())
    assert db_call(lambda: ServedModel.objects.get(pk=model.pk).slo_ttft_p99_ms) == 500
    assert db_call(lambda: Job.objects.count()) == 0
