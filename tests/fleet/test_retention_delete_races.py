"""Telemetry retention while a deployment, a host or a device is deleted, on PostgreSQL's row locks.

Retention folds a deployment's raw samples into new minute rows, which refer to it. A delete
committed after the fold read the samples failed the whole retention pass at commit (IntegrityError;
every host's fold retried a minute later). A delete started while the pass held the deployment's
samples waited for them holding the deployment's row, which the pass's foreign-key check waited for
at commit: PostgreSQL aborted one of the two as a deadlock. Retention now takes the foreign-key
check's lock on the deployments and devices up front and folds only those that still exist; every
delete of a device (its host's, the agent's register, the admin's) locks the device's row before
its cascade deletes the samples the pass is about to delete."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from agents import retention, services
from agents.models import DeviceMinute, DeviceSample, EngineMinute, EngineSample
from deployments.models import Deployment
from django.contrib import admin
from django.db import connection
from django.test import RequestFactory
from django.utils import timezone
from inventory.admin import HostAdmin
from inventory.models import Device, Host
from inventory.services import register_host
from registry.models import ServedModel

from gpu_agent.protocol import Register, parse_frame
from tests.pg_locks import in_thread, wait_until_blocked

from .conftest import register_frame

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: the PostgreSQL path"),
]


def deployment_with_old_samples() -> Deployment:
    host = Host.objects.create(name="gpu-a")
    device = Device.objects.create(host=host, index=0, uuid="GPU-0", name="H100", memory_total_bytes=80 << 30)
    model = ServedModel.objects.create(
        name="m", source="/m", max_context_length=128, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
    )
    deployment = Deployment.objects.create(model=model, host=host)
    deployment.devices.set([device])
    old = timezone.now() - timedelta(hours=1)
    EngineSample.objects.create(deployment=deployment, ts=old, state="running")
    return deployment


@pytest.mark.parametrize("pause_at", ["after-reading", "after-folding"])
def test_a_deployment_deleted_during_retention_is_deleted_and_the_pass_stores_the_rest(
    monkeypatch: pytest.MonkeyPatch, pause_at: str
) -> None:
    """after-reading: the delete commits between the fold's read and its writes; after-folding: the
    delete starts while the pass holds what it wrote."""
    deployment = deployment_with_old_samples()
    kept = Deployment.objects.create(model=deployment.model, host=deployment.host)
    EngineSample.objects.create(deployment=kept, ts=timezone.now() - timedelta(hours=1), state="running")
    paused, go_on, errors = threading.Event(), threading.Event(), list[str]()
    fold, downsample = retention.fold, retention._downsample

    def pause() -> None:
        paused.set()
        assert go_on.wait(30)

    def fold_pausing(spec: retention.Spec, *args: Any) -> Any:
        out = fold(spec, *args)
        if spec is retention.ENGINE_SPEC and pause_at == "after-reading":
            pause()
        return out

    def downsample_pausing(raw_model: Any, *args: Any) -> Any:
        out = downsample(raw_model, *args)
        if raw_model is EngineSample and pause_at == "after-folding":
            pause()
        return out

    monkeypatch.setattr(retention, "fold", fold_pausing)
    monkeypatch.setattr(retention, "_downsample", downsample_pausing)
    threads = [in_thread("retention", retention.downsample_and_prune, errors)]
    assert paused.wait(30)
    threads.append(in_thread("delete", Deployment.objects.get(pk=deployment.pk).delete, errors))
    if pause_at == "after-reading":
        threads.pop().join(timeout=60)  # nothing holds it up
    else:
        wait_until_blocked(None)  # the delete waits for what the pass holds
    go_on.set()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()

    assert errors == []
    assert list(Deployment.objects.values_list("pk", flat=True)) == [kept.pk]
    assert list(EngineMinute.objects.values_list("deployment_id", flat=True)) == [kept.pk]
    assert not EngineSample.objects.exists() and not DeviceMinute.objects.exists()


def race_retention_holding_devices(monkeypatch: pytest.MonkeyPatch, name: str, work: Any) -> list[str]:
    """Run a retention pass paused right after it locked the devices it folds, start ``work`` in a
    thread of its own, let the pass go on once ``work`` waits for a lock; the errors of both."""
    paused, go_on, errors = threading.Event(), threading.Event(), list[str]()
    lock_keys = retention._lock_keys

    def lock_keys_pausing(model: Any, pks: set[int]) -> set[int]:
        out = lock_keys(model, pks)
        if model is Device:
            paused.set()
            assert go_on.wait(30)
        return out

    monkeypatch.setattr(retention, "_lock_keys", lock_keys_pausing)
    threads = [in_thread("retention", retention.downsample_and_prune, errors)]
    assert paused.wait(30)
    threads.append(in_thread(name, work, errors))
    wait_until_blocked(None)  # it waits for the pass
    go_on.set()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    return errors


def test_a_device_an_agent_no_longer_reports_is_deleted_during_retention_without_a_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agent's register deletes the device its host no longer has (its samples first, then its
    row) while the pass holds the device's foreign-key lock and is yet to delete those samples."""
    host = register_host("gpu-a", "10.0.0.5")
    frame = parse_frame(register_frame(gpus=2))
    assert isinstance(frame, Register)
    services.register(host, frame)
    gone = Device.objects.get(host=host, index=1)
    DeviceSample.objects.create(
        device=gone, ts=timezone.now() - timedelta(hours=1), memory_used_bytes=1, memory_free_bytes=1
    )
    one = parse_frame(register_frame(gpus=1))
    assert isinstance(one, Register)
    errors = race_retention_holding_devices(monkeypatch, "register", lambda: services.register(host, one))

    assert errors == []
    assert list(Device.objects.values_list("index", flat=True)) == [0]
    assert not DeviceSample.objects.exists() and not DeviceMinute.objects.exists()


def delete_host(pk: int) -> None:
    Host.objects.get(pk=pk).delete()


def delete_host_in_the_admin(pk: int) -> None:
    request = RequestFactory().post("/admin/inventory/host/")
    HostAdmin(Host, admin.site).delete_queryset(request, Host.objects.filter(pk=pk))


def delete_device(pk: int) -> None:
    Device.objects.get(host_id=pk, index=0).delete()  # the admin's device inline deletes one so


@pytest.mark.parametrize("delete", [delete_host, delete_host_in_the_admin, delete_device])
def test_a_host_or_device_deleted_during_retention_is_deleted_without_a_deadlock(
    monkeypatch: pytest.MonkeyPatch, delete: Any
) -> None:
    """An operator deletes a host (or one of its devices) in the admin while the pass holds the
    device's foreign-key lock and is yet to delete its old samples; the cascade deleted them first
    and then waited for the device's row."""
    host = Host.objects.create(name="gpu-a")
    device = Device.objects.create(host=host, index=0, uuid="GPU-0", name="H100", memory_total_bytes=80 << 30)
    DeviceSample.objects.create(
        device=device, ts=timezone.now() - timedelta(hours=1), memory_used_bytes=1, memory_free_bytes=1
    )
    errors = race_retention_holding_devices(monkeypatch, "delete", lambda: delete(host.pk))

    assert errors == []
    assert not Device.objects.exists() and not DeviceSample.objects.exists()
    assert not DeviceMinute.objects.exists()  # folded, then deleted with its device
