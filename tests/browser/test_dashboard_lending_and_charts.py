"""Dashboard audit in headless Chromium: a device lending to its own engine shows its lending, empty
model charts show the recent past (not the year 2000), and a failed profile job page (no result)
shows its error once and throws no script error."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from accounts.models import User
from deployments.models import Deployment
from django.utils import timezone
from inventory.models import Device, DeviceKind
from inventory.services import register_host
from jobs.models import Job, JobStatus
from registry.models import ServedModel

from tests.browser.conftest import db_call, screenshot, sign_in
from tests.dashboard.helpers import GIB, add_device_sample, add_engine_sample
from tests.fleet.servers import AsgiServer

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _self_lending_cpu_host() -> None:
    """A CPU host whose producer CLI lends 4 GiB of host memory, of which its engine borrows 1 GiB
    (as gpu_agent.aqua.device_states reports it: a consumer with lent bytes, paired with itself)."""
    host = register_host("cpu-a", "127.0.0.1")
    cpu = Device.objects.create(
        host=host,
        index=0,
        uuid="CPU-a-0",
        name="host memory",
        kind=DeviceKind.CPU,
        memory_total_bytes=64 * GIB,
    )
    add_device_sample(
        cpu,
        memory_used_bytes=16 * GIB,
        memory_free_bytes=48 * GIB,
        aqua_role="consumer",
        lent_bytes=4 * GIB,
        borrowed_bytes=GIB,
        paired_with=0,
    )


def _errors(page: Any) -> list[str]:
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


def test_a_device_that_lends_to_its_own_engine_shows_its_lending(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    db_call(_self_lending_cpu_host)
    page = sign_in(browser, server.url, "ada")
    section = page.locator("section[data-host=cpu-a]")
    section.wait_for()
    screenshot(page, "dashboard-self-lending")
    assert section.locator(".pairings").inner_text() == "Lending: CPU 0 → itself"
    card = section.locator(".card")
    assert card.locator("h3").inner_text() == "CPU 0 · host memory"
    assert card.locator(".badge.role").inner_text() == "consumer + producer"
    assert card.locator("p.lent").inner_text() == "lent 4.0 GiB to itself"
    assert card.locator("p.borrowed").inner_text() == "borrowed 1.0 GiB from itself"
    # The borrowed gigabyte lies inside the lent four: the bar draws 12 own + 3 lent + 1 borrowed.
    widths = card.locator(".membar .seg").evaluate_all("ss => ss.map(s => s.className + ' ' + s.style.width)")
    assert widths == ["seg used 18.75%", "seg lent 4.69%", "seg borrowed 1.56%"]


def _unified_memory_gpu_host() -> None:
    """A GB10-like host: NVML reports no memory for its GPU (registered and sampled as 0 bytes)."""
    host = register_host("spark-1", "127.0.0.1")
    gpu = Device.objects.create(
        host=host, index=0, uuid="GPU-spark-0", name="NVIDIA GB10", kind=DeviceKind.GPU, memory_total_bytes=0
    )
    add_device_sample(gpu, memory_used_bytes=0, memory_free_bytes=0, utilization_pct=35.0)


def test_a_gpu_whose_memory_is_not_reported_says_so_not_zero_bytes(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    db_call(_unified_memory_gpu_host)
    page = sign_in(browser, server.url, "ada")
    errors = _errors(page)
    card = page.locator("section[data-host=spark-1] .card")
    card.wait_for()
    assert card.locator("p.mem").inner_text() == "memory not reported"  # was "0 B used of 0 B"
    assert card.locator("p.util").inner_text() == "util 35%"
    assert errors == []


def test_empty_model_charts_show_the_last_minutes_and_say_there_is_nothing_yet(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    model = db_call(
        lambda: ServedModel.objects.create(
            name="m", source="x/y", max_context_length=512, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
        )
    )
    page = sign_in(browser, server.url, "ada")
    errors = _errors(page)
    page.goto(f"/models/{model.pk}/")
    page.wait_for_function("() => document.getElementById('chart-ttft').layout !== undefined")
    screenshot(page, "dashboard-empty-model")
    assert page.locator("#attainment").inner_text() == "no samples in the last minute"
    assert "last minute" in page.locator("dt", has_text="Attainment").inner_text()
    for chart in ("chart-ttft", "chart-rate"):
        start, end = page.evaluate(f"() => document.getElementById('{chart}').layout.xaxis.range")
        now_year = page.evaluate("() => new Date().toISOString().slice(0, 4)")
        assert start.startswith(now_year[:3]) and end.startswith(now_year), (chart, start, end)
        texts = page.evaluate(f"() => document.getElementById('{chart}').layout.annotations.map(a => a.text)")
        assert "no samples yet" in texts
    assert errors == []


def test_a_failed_profile_job_page_shows_its_error_once_and_throws_no_script_error(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    job = db_call(
        lambda: Job.objects.create(
            kind="profile", params={"model": "m"}, status=JobStatus.FAILED, error="boom"
        )
    )
    page = sign_in(browser, server.url, "ada")
    errors = _errors(page)
    page.goto(f"/jobs/{job.pk}/", wait_until="load")
    page.wait_for_selector("#live-status[data-state=live]")
    # jobs.js has applied the socket's state (it fills in the percentage): the status cell shows the
    # status alone, the error is shown once, below.
    page.wait_for_function("() => document.querySelector('tr[data-job] .pct').textContent === '0%'")
    assert page.locator("tr[data-job] .status").inner_text() == "failed"
    assert page.locator("pre.error").inner_text() == "boom"
    assert errors == []


def test_a_job_row_added_live_names_its_progress_bar(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    page = sign_in(browser, server.url, "ada", "/jobs/")
    page.wait_for_selector("#live-status[data-state=live]")
    job = db_call(lambda: Job.objects.create(kind="noop", status=JobStatus.RUNNING, progress=0.25))
    bar = page.locator(f'tr[data-job="{job.pk}"] progress')
    bar.wait_for()
    assert bar.get_attribute("aria-label") == f"progress of job {job.pk}"


def test_the_profile_chart_keeps_its_slo_lines_in_view_and_names_them(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    # The curve stays far under both SLOs: autorange alone would leave the SLO lines off the chart.
    curve = [{"rate": r, "ttft_p99_s": 0.01 * r, "tbt_p99_s": 0.001 * r} for r in (1.0, 2.0, 4.0)]
    result = {
        "max_rps": 4.0,
        "role": "producer",
        "sla": {"ttft_p99_s": 0.5, "tbt_p99_s": 0.05},
        "curve": curve,
    }
    job = db_call(lambda: Job.objects.create(kind="profile", status=JobStatus.SUCCEEDED, result=result))
    page = sign_in(browser, server.url, "ada", f"/jobs/{job.pk}/")
    page.wait_for_function("() => document.getElementById('chart-profile').layout !== undefined")
    screenshot(page, "dashboard-profile-chart")
    layout = page.evaluate(
        "() => { const l = document.getElementById('chart-profile').layout;"
        " return [l.yaxis.range, l.yaxis2.range, l.annotations.map(a => a.text)]; }"
    )
    (y_low, y_high), (y2_low, y2_high), notes = layout
    assert y_low == 0 and y_high > 500 and y2_low == 0 and y2_high > 50
    assert sorted(notes) == ["TBT SLO", "TTFT SLO", "max rate"]


def _idle_deployment() -> ServedModel:
    model = ServedModel.objects.create(
        name="idle", source="x/y", max_context_length=512, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
    )
    host = register_host("idle-host", "127.0.0.1")
    deployment = Deployment.objects.create(model=model, host=host, observed_state="running")
    now = timezone.now()
    for k in range(5):
        add_engine_sample(deployment, now - timedelta(seconds=5 * k), running=0, waiting=0)
    return model


def test_the_charts_of_flat_series_start_at_zero(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    model = db_call(_idle_deployment)
    page = sign_in(browser, server.url, "ada")
    errors = _errors(page)
    page.goto(f"/models/{model.pk}/")
    page.wait_for_function("() => document.getElementById('chart-queue')._fullLayout !== undefined")
    # Flat series (0 requests, a steady rate): autorange around them drew -1..1 and 1..3.
    for chart in ("chart-queue", "chart-rate", "chart-preempt"):
        low, high = page.evaluate(f"() => document.getElementById('{chart}')._fullLayout.yaxis.range")
        assert low == 0 and high > 0, (chart, low, high)
    assert errors == []


def _pending_deployment() -> Deployment:
    model = ServedModel.objects.create(
        name="fresh", source="x/y", max_context_length=512, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
    )
    host = register_host("fresh-host", "127.0.0.1")
    return Deployment.objects.create(model=model, host=host, observed_state="pending")


def test_a_deployments_state_on_its_model_page_follows_its_agents_reports(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    """The page is live (its charts and attainment update), but a deployment just made there said
    "pending" until the page was reloaded, while the GPU map had it running for long."""
    deployment = db_call(_pending_deployment)
    page = sign_in(browser, server.url, "ada")
    errors = _errors(page)
    page.goto(f"/models/{deployment.model_id}/")
    state = page.locator(f"#deployments [data-deployment='{deployment.pk}'] .deployment-state")
    assert state.inner_text() == "pending"
    # A state the liveness sweep leaves as it is (it makes an offline host's running ones unknown).
    db_call(lambda: Deployment.objects.filter(pk=deployment.pk).update(observed_state="failed"))
    page.wait_for_function("(el) => el.textContent === 'failed'", arg=state.element_handle(), timeout=15_000)
    db_call(lambda: Deployment.objects.filter(pk=deployment.pk).update(desired_state="stopped"))
    page.wait_for_function(
        "(el) => el.textContent === 'failed (stopping or stopped)'",
        arg=state.element_handle(),
        timeout=15_000,
    )
    assert errors == []
