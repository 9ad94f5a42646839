"""What the gateway records: usage per key, model and period; each key's rate-limit state; the
tokens its requests in flight hold against its daily quota; and per-request latency samples that
feed each model's SLO metrics.

Counters and rate-limit states are updated with ``F()`` expressions (one UPDATE, atomic on SQLite
and PostgreSQL); a missing row is created under its unique constraint and a lost creation race
becomes an update (see ``record_usage`` in gateway/services.py).
"""

from __future__ import annotations

from accounts.models import ApiKey
from deployments.models import Deployment
from django.db import models
from registry.models import ServedModel


class Usage(models.Model):
    """Tokens and requests of one key on one model within one period (a UTC day).

    Billing history: never pruned. It outlives a key's revocation, and its key cannot be deleted
    (revoke the key, deactivate the user instead). A model can be deleted: its rows keep the
    model's name in ``model_name`` and lose the link.
    """

    key = models.ForeignKey(ApiKey, on_delete=models.PROTECT, related_name="usage")
    model = models.ForeignKey(ServedModel, on_delete=models.SET_NULL, null=True, related_name="usage")
    model_name = models.CharField(max_length=100, help_text="the model's name when it was used")
    period_start = models.DateTimeField(help_text="start of the UTC day the counts belong to")
    requests = models.PositiveBigIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["period_start", "key_id", "model_id"]
        constraints = [
            models.UniqueConstraint(fields=["key", "model", "period_start"], name="gateway_usage_unique")
        ]

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __str__(self) -> str:
        return f"usage of key {self.key_id} on {self.model_name} from {self.period_start:%Y-%m-%d}"


class RateLimitState(models.Model):
    """A key's requests-per-minute state: one row per key, created on its first request (the
    generic cell rate algorithm in gateway/quota.py), deleted with the key."""

    key = models.OneToOneField(ApiKey, on_delete=models.CASCADE, primary_key=True, related_name="+")
    tat_ns = models.BigIntegerField(
        help_text="theoretical arrival time: from then on the key has its full burst again "
        "(nanoseconds since the Unix epoch)"
    )


class TokenReservation(models.Model):
    """The most tokens one admitted request may still cost, held against its key's daily quota
    from its admission until it finishes and its real usage is booked (gateway/reservations.py).

    A web process that dies mid-request leaves its reservations behind: they stop counting at
    ``expires_at`` and are pruned with the telemetry retention."""

    key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="+")
    tokens = models.PositiveBigIntegerField(help_text="prompt estimate + n x max_tokens")
    created_at = models.DateTimeField(help_text="admission, by the database clock: the quota's day")
    expires_at = models.DateTimeField(help_text="from then on it no longer counts")

    class Meta:
        indexes = [models.Index(fields=["expires_at"], name="gateway_reservation_expiry")]  # pruning

    def __str__(self) -> str:
        return f"{self.tokens} tokens of key {self.key_id} until {self.expires_at:%H:%M:%S}"


class RequestSample(models.Model):
    """One proxied request's latencies as the gateway saw them (seconds; None when not measured).

    ``ttft_s`` runs from the request's arrival at the gateway to the first generated token;
    ``tbt_*`` are over the gaps between successive token chunks of a streamed response.
    Kept for ``REQUEST_SAMPLE_RETENTION`` (gateway/services.py), pruned with the telemetry.
    """

    model = models.ForeignKey(ServedModel, on_delete=models.CASCADE, related_name="+")
    deployment = models.ForeignKey(Deployment, on_delete=models.SET_NULL, null=True, related_name="+")
    ts = models.DateTimeField(help_text="when the request finished")
    stream = models.BooleanField()
    outcome = models.CharField(max_length=16, help_text="completed, disconnected or failed")
    ttft_s = models.FloatField(null=True)
    tbt_mean_s = models.FloatField(null=True)
    tbt_max_s = models.FloatField(null=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = [
            models.Index(fields=["model", "ts"], name="gateway_sample_model_ts"),  # latency charts
            models.Index(fields=["ts"], name="gateway_sample_ts"),  # retention
        ]
