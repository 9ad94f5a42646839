"""A model deleted while its profile job runs: the job fails saying so, not with the database's
foreign-key error and a traceback, and no profile is stored."""

from __future__ import annotations

from typing import Any

import pytest
from jobs.models import JobStatus
from jobs.tasks import run_job
from planning import profiling
from planning.models import ModelProfile
from registry.models import ServedModel

from tests.planning.helpers import make_model, queued_profile_job


@pytest.mark.django_db(transaction=True)
def test_a_model_deleted_while_profiled_fails_the_job_with_a_clear_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = make_model("llama-3-8b")
    job = queued_profile_job()
    measure = profiling.profile_model

    def measure_then_delete(*args: Any, **kwargs: Any) -> Any:
        profile = measure(*args, **kwargs)
        ServedModel.objects.filter(pk=model.pk).delete()  # the operator's DELETE, meanwhile
        return profile

    monkeypatch.setattr(profiling, "profile_model", measure_then_delete)
    run_job(job.pk)

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.error == (
        "ProfilingError: model 'llama-3-8b' was deleted while it was profiled; nothing was stored"
    )
    assert not ModelProfile.objects.exists()
