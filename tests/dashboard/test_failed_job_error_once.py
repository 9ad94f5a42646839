"""A failed job's page shows its status in the status cell and its error once, below it (the jobs
list is where a row carries "status: error"; jobs.js keeps the job page so after socket updates, see
tests/browser/test_dashboard_lending_and_charts.py)."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from jobs.models import Job, JobStatus

pytestmark = pytest.mark.django_db


def test_it_shows_a_failed_jobs_error_once_below_its_status(viewer_client: Client) -> None:
    error = "the placer found no placement: c10 needs 10 GiB"
    job = Job.objects.create(kind="place", params={}, status=JobStatus.FAILED, error=error)
    page = viewer_client.get(f"/jobs/{job.pk}/").content.decode()
    row = re.search(rf'<tr data-job="{job.pk}" data-status="failed">(.*?)</tr>', page, re.S)
    assert row is not None, page
    assert re.search(r'<td class="status">failed</td>', row[1])
    assert page.count(error) == 1 and f'<pre class="error">{error}</pre>' in page


def test_the_jobs_list_shows_a_failed_jobs_error_in_its_row(viewer_client: Client) -> None:
    # As jobs.js writes the row after a socket update: the first render says the same.
    job = Job.objects.create(kind="place", params={}, status=JobStatus.FAILED, error="no placement")
    page = viewer_client.get("/jobs/").content.decode()
    row = re.search(rf'<tr data-job="{job.pk}" data-status="failed">(.*?)</tr>', page, re.S)
    assert row is not None, page
    assert '<td class="status">failed: no placement</td>' in row[1]
