"""The host admin page shows what the agent and the liveness sweep report (status, last seen,
heartbeat interval) without letting them be edited: an interval set by hand was unbounded (1e308
kept a dead host online until its agent registered again), and the others are overwritten."""

from __future__ import annotations

from typing import Any

import pytest
from accounts.models import User
from deployments.services import create_deployment
from django.db.models import ProtectedError
from django.test import Client
from inventory.models import AgentToken, Device, Host, HostStatus
from inventory.services import agent_tokens_revoked, authenticate_agent, issue_agent_token, register_host
from registry.models import ServedModel


@pytest.mark.django_db
def test_the_reported_fields_of_a_host_are_read_only_in_the_admin() -> None:
    host = Host.objects.create(name="gpu-a", address="10.0.0.5", heartbeat_interval_s=5.0)
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="root-pw-8d1x"))
    page = client.get(f"/admin/inventory/host/{host.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    for field in ("status", "last_seen_at", "heartbeat_interval_s"):
        assert f'name="{field}"' not in html, field  # shown, not an input
    form = {"name": "gpu-a", "address": "10.0.0.6", "heartbeat_interval_s": "1e308", "status": "online"}
    form |= {"devices-TOTAL_FORMS": "0", "devices-INITIAL_FORMS": "0"}
    assert client.post(f"/admin/inventory/host/{host.pk}/change/", form).status_code == 302
    host.refresh_from_db()
    assert host.address == "10.0.0.6"  # the editable field was saved ...
    assert host.heartbeat_interval_s == 5.0 and host.status == HostStatus.OFFLINE  # ... these were not


@pytest.mark.django_db
def test_the_admin_cannot_move_an_agent_token_to_another_host_or_revive_it() -> None:
    a, b = register_host("gpu-a"), register_host("gpu-b")
    issued = issue_agent_token(a)
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="root-pw-8d1x"))
    url = f"/admin/inventory/agenttoken/{issued.record.pk}/change/"
    assert 'name="host"' not in client.get(url).content.decode()
    sent: list[dict[str, Any]] = []

    def record(sender: Any, **kwargs: Any) -> None:
        sent.append(kwargs)

    agent_tokens_revoked.connect(record, sender=AgentToken)
    try:
        assert client.post(url, {"host": b.pk, "revoked": "on"}).status_code == 302
    finally:
        agent_tokens_revoked.disconnect(record, sender=AgentToken)
    assert authenticate_agent(issued.plaintext) is None  # revoking works ...
    assert [s["token_ids"] for s in sent] == [[issued.record.pk]]  # ... its open connections told
    token = AgentToken.objects.get(pk=issued.record.pk)
    assert token.host_id == a.pk and token.revoked  # ... moving does not
    assert client.post(url, {}).status_code == 302  # un-ticking "revoked"
    assert AgentToken.objects.get(pk=issued.record.pk).revoked  # stays revoked
    assert client.get("/admin/inventory/agenttoken/add/").status_code == 403


def inline_form(host: Host, delete: set[int]) -> dict[str, str]:
    """The host's change form as the admin posts it, ticking "delete" for the devices in ``delete``."""
    devices = list(host.devices.order_by("index"))
    form = {"name": host.name, "address": host.address}
    form |= {"devices-TOTAL_FORMS": str(len(devices)), "devices-INITIAL_FORMS": str(len(devices))}
    for i, device in enumerate(devices):
        form[f"devices-{i}-id"] = str(device.pk)
        form[f"devices-{i}-host"] = str(host.pk)
        if device.pk in delete:
            form[f"devices-{i}-DELETE"] = "on"
    return form


@pytest.mark.django_db
def test_the_admin_shows_a_hosts_devices_and_deletes_only_those_no_deployment_uses() -> None:
    host = register_host("gpu-a", "10.0.0.5")
    used, spare = (
        Device.objects.create(host=host, index=i, uuid=f"GPU-{i}", name="H100", memory_total_bytes=80 << 30)
        for i in range(2)
    )
    model = ServedModel.objects.create(
        name="m", source="/m", max_context_length=256, slo_ttft_p99_ms=1.0, slo_tbt_p99_ms=1.0
    )
    deployment = create_deployment(model, host, [used])
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="root-pw-8d1x"))
    url = f"/admin/inventory/host/{host.pk}/change/"
    html = client.get(url).content.decode()
    assert 'name="devices-0-index"' not in html and 'name="devices-0-uuid"' not in html  # shown only
    # Deleting it took it out of the running deployment: its agent was sent a spec with no devices.
    refused = client.post(url, inline_form(host, {used.pk}))
    assert refused.status_code == 200
    assert f"is used by deployment(s) {deployment.pk}: delete those first." in refused.content.decode()
    assert list(deployment.devices.all()) == [used]
    assert client.post(url, inline_form(host, {spare.pk})).status_code == 302
    assert list(Device.objects.filter(host=host)) == [used]
    with pytest.raises(ProtectedError):  # the rule holds below the admin's form too
        Device.objects.get(pk=used.pk).delete()
    assert list(deployment.devices.all()) == [used]
