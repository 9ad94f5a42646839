"""The host admin page shows what the agent and the liveness sweep report (status, last seen,
heartbeat interval) without letting them be edited: an interval set by hand was unbounded (1e308
kept a dead host online until its agent registered again), and the others are overwritten."""

from __future__ import annotations

import pytest
from accounts.models import User
from django.test import Client
from inventory.models import Host, HostStatus


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
