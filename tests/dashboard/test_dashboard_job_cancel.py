"""An admin cancels a queued or running job from its page; a viewer is offered no Cancel and is
refused one; a job that finished before the Cancel arrived says so and keeps its status."""

from __future__ import annotations

import pytest
from django.test import Client
from jobs.models import Job, JobStatus

pytestmark = pytest.mark.django_db


def test_an_admin_cancels_a_running_job_from_its_page(admin_client: Client, viewer_client: Client) -> None:
    job = Job.objects.create(kind="noop", params={}, status=JobStatus.RUNNING)
    url = f"/jobs/{job.pk}/"
    assert 'id="cancel-job"' in admin_client.get(url).content.decode()
    assert 'id="cancel-job"' not in viewer_client.get(url).content.decode()

    assert viewer_client.post(f"{url}cancel/").status_code == 403
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING

    response = admin_client.post(f"{url}cancel/")
    assert response.status_code == 302 and response["Location"] == url
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED and job.finished_at is not None
    page = admin_client.get(url).content.decode()
    assert 'id="notice">Cancelled.</p>' in page and 'id="cancel-job"' not in page


def test_a_cancel_of_a_job_that_finished_meanwhile_says_so_and_changes_nothing(admin_client: Client) -> None:
    job = Job.objects.create(kind="noop", params={}, status=JobStatus.SUCCEEDED, progress=1.0)
    response = admin_client.post(f"/jobs/{job.pk}/cancel/")
    assert response.status_code == 409
    assert f'id="refusal">Not cancelled: job {job.pk} is already succeeded.</p>' in response.content.decode()
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
