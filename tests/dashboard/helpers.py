"""Row makers shared by the dashboard and browser tests."""

from __future__ import annotations

from datetime import datetime

from agents.models import DeviceSample, EngineSample
from deployments.models import Deployment
from django.utils import timezone
from inventory.models import Device

GIB = 1 << 30


def add_device_sample(device: Device, ts: datetime | None = None, **values: object) -> DeviceSample:
    fields: dict[str, object] = {"memory_used_bytes": 10 * GIB, "memory_free_bytes": 70 * GIB}
    fields.update(values)
    return DeviceSample.objects.create(device=device, ts=ts or timezone.now(), **fields)


def add_engine_sample(deployment: Deployment, ts: datetime, **values: object) -> EngineSample:
    fields: dict[str, object] = {
        "state": "running",
        "ttft_count": 10,
        "ttft_p50": 0.1,
        "ttft_p99": 0.3,
        "itl_count": 100,
        "itl_p50": 0.01,
        "itl_p99": 0.03,
    }
    fields.update(values)
    return EngineSample.objects.create(deployment=deployment, ts=ts, **fields)
