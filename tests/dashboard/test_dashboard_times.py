"""The API keys' and the jobs' tables (and a plan's "Applied" line) write their times as the dashboard's
other times are drawn: to the second, in UTC, saying so ("2026-03-04 05:06:07 UTC"), each in a
``<time>`` whose ``datetime`` is the ISO 8601 time, not ISO strings with microseconds as text."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from accounts.models import ApiKey, User
from accounts.services import create_api_key
from django.test import Client
from jobs.models import Job, JobStatus
from planning.models import PlacementPlan

pytestmark = pytest.mark.django_db

CREATED = datetime(2026, 3, 4, 5, 6, 7, 891234, tzinfo=UTC)
USED = datetime(2026, 3, 5, 23, 59, 58, 5, tzinfo=UTC)


def _text(page: str) -> str:
    """What a reader sees: the page without its tags."""
    return re.sub(r"<[^>]*>", "", page)


def test_the_api_keys_table_writes_readable_utc_times(viewer_client: Client, viewer_user: User) -> None:
    used = create_api_key(viewer_user, "used").record
    never = create_api_key(viewer_user, "never").record
    ApiKey.objects.filter(pk=used.pk).update(created_at=CREATED, last_used_at=USED)
    ApiKey.objects.filter(pk=never.pk).update(created_at=CREATED)

    page = viewer_client.get("/api-keys/").content.decode()
    row = re.search(rf'<tr data-key="{used.pk}".*?</tr>', page, re.S)
    assert row is not None
    assert '<time datetime="2026-03-04T05:06:07.891234+00:00">2026-03-04 05:06:07 UTC</time>' in row[0]
    assert '<time datetime="2026-03-05T23:59:58.000005+00:00">2026-03-05 23:59:58 UTC</time>' in row[0]
    other = re.search(rf'<tr data-key="{never.pk}".*?</tr>', page, re.S)
    assert other is not None and '<span class="empty">never</span>' in other[0]
    assert "2026-03-04T05" not in _text(page) and "891234" not in _text(page)


def test_the_jobs_table_writes_readable_utc_times(viewer_client: Client) -> None:
    job = Job.objects.create(kind="noop", params={})
    Job.objects.filter(pk=job.pk).update(created_at=CREATED)

    page = viewer_client.get("/jobs/").content.decode()
    row = re.search(rf'<tr data-job="{job.pk}".*?</tr>', page, re.S)
    assert row is not None
    assert (
        '<td><time datetime="2026-03-04T05:06:07.891234+00:00">2026-03-04 05:06:07 UTC</time></td>' in row[0]
    )
    assert "2026-03-04T05" not in _text(page) and "891234" not in _text(page)


def test_an_applied_plan_says_when_in_readable_utc(viewer_client: Client, admin_user: User) -> None:
    job = Job.objects.create(kind="place", params={}, status=JobStatus.SUCCEEDED)
    PlacementPlan.objects.create(
        job=job,
        plan={"servers": [], "assignments": []},
        moves=[],
        fingerprint="0" * 64,
        applied_at=CREATED,
        applied_by=admin_user,
    )
    page = viewer_client.get(f"/jobs/{job.pk}/").content.decode()
    when = '<time datetime="2026-03-04T05:06:07.891234+00:00">2026-03-04 05:06:07 UTC</time>'
    assert f"<p>Applied {when} by alice.</p>" in page
