"""The dashboard's job form while the Celery broker cannot take a job: a 503 page with the message
and the form as typed, Retry-After, and no job row (the API: tests/control_plane/test_job_broker_down.py).
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from jobs.models import Job

from tests.control_plane.test_job_broker_down import refuse_jobs

pytestmark = pytest.mark.django_db(transaction=True)  # the message goes out when the row commits


def test_the_job_form_answers_503_with_the_message_and_keeps_no_job(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = refuse_jobs(monkeypatch)
    response = admin_client.post(reverse("dashboard:job-start"), {"kind": "noop", "params": '{"steps": 2}'})
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    page = response.content.decode()
    assert '<p class="field-error" data-field="form" role="alert">The job queue cannot take jobs' in page
    assert "{&quot;steps&quot;: 2}" in page  # what was typed, to send again
    assert len(asked) == 1
    assert not Job.objects.exists()
