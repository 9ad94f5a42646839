"""Background jobs run by Celery workers; the row is the job's single source of truth.

Status moves queued -> running -> succeeded | failed, or to cancelled from queued/running. A running
job whose worker stops sending heartbeats is failed as lost (jobs/liveness.py).
Workers write progress and the outcome here (so no Celery result backend is needed), and check
the status between steps to honour cancellation.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class JobStatus(models.TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


ACTIVE_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING)


class Job(models.Model):
    kind = models.CharField(max_length=50)
    params = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    progress = models.FloatField(default=0.0)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    celery_id = models.CharField(max_length=64, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Written by the worker while the job runs (jobs/liveness.py): who runs it, last sign of life.
    worker = models.CharField(max_length=200, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The delivery that claimed the job (jobs.services.execute_job): only its retries take it up again.
    claim = models.CharField(max_length=32, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["status", "kind"])]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(progress__gte=0.0, progress__lte=1.0), name="job_progress_0_1"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES
