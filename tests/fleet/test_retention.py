"""Bounded telemetry retention: raw window, per-minute aggregates, history window, late samples."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from agents.models import DeviceMinute, DeviceSample, EngineMinute, EngineSample
from agents.retention import downsample_and_prune
from agents.tasks import downsample_telemetry
from deployments.models import Deployment
from django.test import override_settings
from django.utils import timezone
from inventory.models import Device, Host
from registry.models import ServedModel

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 3, 1, 12, 30, 20, tzinfo=UTC)
RAW_10_MIN = override_settings(TELEMETRY_RAW_RETENTION_S=600.0, TELEMETRY_HISTORY_RETENTION_S=3600.0)


@pytest.fixture
def device() -> Device:
    host = Host.objects.create(name="gpu-a")
    return Device.objects.create(host=host, index=0, uuid="GPU-0", name="H100", memory_total_bytes=80 << 30)


@pytest.fixture
def deployment(device: Device) -> Deployment:
    model = ServedModel.objects.create(
        name="m", source="/m", max_context_length=128, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
    )
    deployment = Deployment.objects.create(model=model, host=device.host)
    deployment.devices.set([device])
    return deployment


def sample(
    device: Device, ts: datetime, used_gib: int, util: float | None, role: str = "none"
) -> DeviceSample:
    return DeviceSample.objects.create(
        device=device,
        ts=ts,
        memory_used_bytes=used_gib << 30,
        memory_free_bytes=(80 - used_gib) << 30,
        utilization_pct=util,
        aqua_role=role,
        lent_bytes=used_gib,
    )


def test_it_folds_samples_older_than_the_raw_window_into_minutes(device: Device) -> None:
    old_minute = datetime(2026, 3, 1, 12, 10, tzinfo=UTC)  # before the cutoff (12:20)
    sample(device, old_minute + timedelta(seconds=1), 10, 20.0, "consumer")
    sample(device, old_minute + timedelta(seconds=2), 30, None, "consumer")
    sample(device, old_minute + timedelta(seconds=3), 20, 40.0, "producer")
    sample(device, old_minute + timedelta(minutes=1), 50, 90.0)  # the next minute, alone
    recent = sample(device, NOW - timedelta(minutes=5), 60, 10.0)  # inside the raw window

    with RAW_10_MIN:
        report = downsample_and_prune(NOW)

    assert (report.device_minutes, report.raw_deleted) == (2, 4)
    assert list(DeviceSample.objects.values_list("pk", flat=True)) == [recent.pk]
    first, second = DeviceMinute.objects.filter(device=device).order_by("minute")
    assert (first.minute, first.samples) == (old_minute, 3)
    assert first.memory_used_bytes == 20 << 30  # mean of 10, 30, 20 GiB
    assert first.memory_used_max_bytes == 30 << 30
    assert first.utilization_pct == pytest.approx(30.0)  # mean of the samples that reported it
    assert first.aqua_role == "producer"  # the newest sample's
    assert first.lent_bytes == 30  # max
    assert (second.samples, second.memory_used_bytes, second.utilization_pct) == (1, 50 << 30, 90.0)


def test_it_merges_a_late_sample_into_its_folded_minute(device: Device) -> None:
    minute = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    for used in (10, 20):
        sample(device, minute + timedelta(seconds=used), used, 10.0)
    with RAW_10_MIN:
        downsample_and_prune(NOW)
        sample(device, minute + timedelta(seconds=50), 60, 70.0)  # flushed after a reconnect
        downsample_and_prune(NOW)
    row = DeviceMinute.objects.get(device=device)
    assert row.samples == 3
    assert row.memory_used_bytes == 30 << 30  # (10 + 20 + 60) / 3
    assert row.utilization_pct == pytest.approx(30.0)
    assert not DeviceSample.objects.exists()


def test_it_drops_minutes_older_than_the_history_window(device: Device) -> None:
    kept = NOW.replace(second=0) - timedelta(minutes=30)
    for minute in (NOW.replace(second=0) - timedelta(hours=2), kept):
        DeviceMinute.objects.create(
            device=device,
            minute=minute,
            samples=1,
            memory_used_bytes=1,
            memory_used_max_bytes=1,
            memory_free_bytes=1,
        )
    with RAW_10_MIN:
        report = downsample_and_prune(NOW)
    assert report.minutes_deleted == 1
    assert list(DeviceMinute.objects.values_list("minute", flat=True)) == [kept]


def test_it_aggregates_engine_latencies_by_request_count(deployment: Deployment) -> None:
    minute = (timezone.now() - timedelta(minutes=30)).replace(second=0, microsecond=0)
    windows = [(3, 0.1, 0.3, 1), (1, 0.5, 0.9, 4), (0, None, None, 2)]  # (count, p50, p99, preemptions)
    for i, (count, p50, p99, preempted) in enumerate(windows):
        EngineSample.objects.create(
            deployment=deployment,
            ts=minute + timedelta(seconds=i),
            state="running",
            ttft_count=count,
            ttft_p50=p50,
            ttft_p99=p99,
            kv_cache_usage=0.2 * (i + 1),
            running=i,
            preemptions_total=preempted,
        )
    with RAW_10_MIN:
        downsample_telemetry()  # the Celery task, called as the worker would
    row = EngineMinute.objects.get(deployment=deployment)
    assert (row.samples, row.ttft_count) == (3, 4)
    assert row.ttft_p50 == pytest.approx((3 * 0.1 + 1 * 0.5) / 4)
    assert row.ttft_p99 == 0.9
    assert row.kv_cache_usage == pytest.approx(0.4)
    assert row.running == pytest.approx(1.0)
    assert row.preemptions_total == 4
    assert not EngineSample.objects.exists()
