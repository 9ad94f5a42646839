"""Planning state: each model's current profile, placement plans, and probes relayed to agents.

- `ModelProfile`: the latest successful profile of a served model (one per model, replaced by the
  next profile job), the placer's input.
- `PlacementPlan`: a succeeded `place` job's plan, the deployments it was computed against (a
  fingerprint, to refuse a stale apply) and when it was applied.
- `ProbeRequest`: one rate probe of a real engine, written by a worker, relayed to the host's agent
  by the ASGI process that holds the agent's websocket, answered there (see planning/relay.py).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from inventory.models import Host
from jobs.models import Job
from registry.models import ServedModel


class ProfileBackend(models.TextChoices):
    SIMULATOR = "simulator", "simulator (cost-model preset)"
    ENGINE = "engine", "real engine through its agent"


class ProfileRole(models.TextChoices):
    PRODUCER = "producer", "producer (lends idle memory)"
    CONSUMER = "consumer", "consumer (borrows memory under bursts)"


class ModelProfile(models.Model):
    """A served model's current profile (``data`` is serving.profiler's ``Profile.to_dict()``)."""

    model = models.OneToOneField(ServedModel, on_delete=models.CASCADE, related_name="profile")
    backend = models.CharField(max_length=16, choices=ProfileBackend.choices)
    role = models.CharField(max_length=16, choices=ProfileRole.choices)
    max_rps = models.FloatField()
    capped = models.BooleanField(default=False, help_text="max_rps is the search ceiling")
    kv_capacity_bytes = models.PositiveBigIntegerField()
    free_kv_bytes = models.PositiveBigIntegerField()
    lendable_bytes = models.PositiveBigIntegerField()
    # burst level ("2x", "4x", ...) -> bytes a consumer must swap out at that burst
    swap_needed_bytes = models.JSONField(default=dict, blank=True)
    cost_model = models.JSONField(null=True, blank=True, help_text="cost model fitted to engine samples")
    slo_ttft_p99_ms = models.FloatField(help_text="the SLO the profile was searched against")
    slo_tbt_p99_ms = models.FloatField()
    tensor_parallel_size = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        help_text="the model's TP size when profiled (null: profiled before it was kept)",
    )
    data = models.JSONField(help_text="the whole profile: curve, workload, bursts")
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model__name"]

    def __str__(self) -> str:
        return f"{self.model.name}: {self.role}, {self.max_rps:.3g} req/s"


class PlacementPlan(models.Model):
    """The plan of a succeeded `place` job, and whether it was applied."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="placement_plan")
    plan = models.JSONField(help_text="serving.placement Plan.to_dict(), relabelled for fewest moves")
    moves = models.JSONField(help_text="the diff against the deployments it was computed on")
    fingerprint = models.CharField(max_length=64, help_text="digest of the deployments it was computed on")
    # A plan names its models; a name may since belong to another model (deleted and re-created, or
    # another one renamed to it), which the plan was not computed for (planning/applying.py).
    model_ids = models.JSONField(
        default=dict, blank=True, help_text="model name -> id of each model it placed, when it was computed"
    )
    applied_at = models.DateTimeField(null=True, blank=True)
    applied_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"plan of job {self.job_id}"


class ProbeStatus(models.TextChoices):
    PENDING = "pending", "pending (not yet sent to the agent)"
    SENT = "sent", "sent to the agent"
    DONE = "done", "done"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


class ProbeRequest(models.Model):
    """One probe of a real engine: ``frame`` is the `probe` frame sent to the host's agent,
    ``result`` the `probe_result` frame it answered with."""

    probe_id = models.CharField(max_length=64, unique=True)
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="probe_requests")
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    frame = models.JSONField()
    status = models.CharField(max_length=16, choices=ProbeStatus.choices, default=ProbeStatus.PENDING)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["host", "status"])]

    def __str__(self) -> str:
        return f"probe {self.probe_id} ({self.status})"
