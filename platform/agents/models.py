"""What agents report over their link: per-second samples, per-minute history, replicas, links.

Retention (see agents/retention.py): raw samples (``DeviceSample``, ``EngineSample``) are kept for
``TELEMETRY_RAW_RETENTION_S`` (10 min by default); older ones are folded into per-minute aggregates
(``DeviceMinute``, ``EngineMinute``) kept for ``TELEMETRY_HISTORY_RETENTION_S`` (24 h).
"""

from __future__ import annotations

from deployments.models import Deployment
from django.db import models
from inventory.models import Device, Host
from registry.models import ServedModel


class AquaRole(models.TextChoices):
    PRODUCER = "producer", "producer (lends memory)"
    CONSUMER = "consumer", "consumer (borrows memory)"
    NONE = "none", "none"


class AgentLink(models.Model):
    """The state of a host's agent connection (one row per host, updated in place)."""

    host = models.OneToOneField(Host, on_delete=models.CASCADE, related_name="agent_link")
    connected = models.BooleanField(default=False)
    agent_version = models.CharField(max_length=64, blank=True)
    connected_at = models.DateTimeField(null=True, blank=True)
    disconnected_at = models.DateTimeField(null=True, blank=True)
    last_telemetry_at = models.DateTimeField(null=True, blank=True)
    telemetry_dropped = models.PositiveBigIntegerField(
        default=0, help_text="telemetry frames the agent dropped while disconnected (cumulative)"
    )
    frames_rejected = models.PositiveBigIntegerField(default=0, help_text="malformed frames received")
    # Statuses are ordered by the agent's clock only within one run: a restarted agent's clock may
    # be behind the one that sent the stored status (stepped back, corrected, another machine).
    run = models.PositiveBigIntegerField(
        default=0,
        help_text="registrations so far: the current connection's agent run (each `register` starts one)",
    )

    def __str__(self) -> str:
        return f"link of {self.host_id}"


class DemoModelSeed(models.Model):
    """The demo model `manage.py local_agent --tiny-model` (`make run`) seeded for a local host.

    Remembered by row, not by name: a restart then finds the model the operator renamed (and keeps
    its source current) instead of seeding a second ``tiny-llama``, and a null ``model`` (the
    operator deleted it) means it is not seeded again."""

    host = models.OneToOneField(Host, on_delete=models.CASCADE, related_name="+")
    model = models.ForeignKey(ServedModel, null=True, on_delete=models.SET_NULL, related_name="+")

    def __str__(self) -> str:
        return f"demo model of host {self.host_id}: {self.model_id}"


class Replica(models.Model):
    """What the host's agent last reported about a deployment's engine.

    ``base_url`` (``http://<host address>:<port>``) is where the engine's OpenAI-compatible server
    answers; it is empty unless the engine is running. The chat gateway routes to it.
    """

    deployment = models.OneToOneField(Deployment, on_delete=models.CASCADE, related_name="replica")
    state = models.CharField(max_length=16)
    error = models.TextField(blank=True)
    restarts = models.PositiveIntegerField(default=0)
    port = models.PositiveIntegerField(null=True, blank=True)
    base_url = models.CharField(max_length=300, blank=True)
    simulated = models.BooleanField(default=False)
    reported_at = models.DateTimeField()  # the status's time, by the agent's clock
    run = models.PositiveBigIntegerField(
        default=0, help_text="the agent run (AgentLink.run) that reported it"
    )

    def __str__(self) -> str:
        return f"replica of deployment {self.deployment_id} ({self.state})"


class DeviceSample(models.Model):
    """One device at one telemetry tick. Bytes are absolute; None: the device cannot report it."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="+")
    ts = models.DateTimeField()
    memory_used_bytes = models.PositiveBigIntegerField()
    memory_free_bytes = models.PositiveBigIntegerField()
    utilization_pct = models.FloatField(null=True)
    temperature_c = models.FloatField(null=True)
    power_w = models.FloatField(null=True)
    aqua_role = models.CharField(max_length=8, choices=AquaRole.choices, default=AquaRole.NONE)
    lent_bytes = models.PositiveBigIntegerField(default=0)
    borrowed_bytes = models.PositiveBigIntegerField(default=0)
    paired_with = models.SmallIntegerField(null=True)  # device index on the other side

    class Meta:
        indexes = [
            models.Index(fields=["device", "ts"], name="agents_devsample_dev_ts"),  # charts, latest sample
            models.Index(fields=["ts"], name="agents_devsample_ts"),  # retention: all devices before a cutoff
        ]


class DeviceMinute(models.Model):
    """A device's samples within one minute: means, and maxima where peaks matter."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="+")
    minute = models.DateTimeField()  # start of the minute (UTC)
    samples = models.PositiveIntegerField()
    memory_used_bytes = models.PositiveBigIntegerField()  # mean
    memory_used_max_bytes = models.PositiveBigIntegerField()
    memory_free_bytes = models.PositiveBigIntegerField()  # mean
    utilization_pct = models.FloatField(null=True)
    temperature_c = models.FloatField(null=True)
    power_w = models.FloatField(null=True)
    aqua_role = models.CharField(max_length=8, choices=AquaRole.choices, default=AquaRole.NONE)  # last
    lent_bytes = models.PositiveBigIntegerField(default=0)  # max
    borrowed_bytes = models.PositiveBigIntegerField(default=0)  # max

    class Meta:
        constraints = [models.UniqueConstraint(fields=["device", "minute"], name="agents_devminute_unique")]
        indexes = [models.Index(fields=["minute"], name="agents_devminute_minute")]  # retention


class EngineSample(models.Model):
    """A deployment's engine over one telemetry window. Latencies in seconds."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="+")
    ts = models.DateTimeField()
    state = models.CharField(max_length=16)
    ttft_count = models.PositiveIntegerField(default=0)
    ttft_p50 = models.FloatField(null=True)
    ttft_p99 = models.FloatField(null=True)
    itl_count = models.PositiveIntegerField(default=0)
    itl_p50 = models.FloatField(null=True)
    itl_p99 = models.FloatField(null=True)
    kv_cache_usage = models.FloatField(null=True)
    running = models.PositiveIntegerField(default=0)
    waiting = models.PositiveIntegerField(default=0)
    preemptions_total = models.PositiveBigIntegerField(default=0)
    bytes_offloaded = models.PositiveBigIntegerField(default=0)

    class Meta:
        indexes = [
            models.Index(fields=["deployment", "ts"], name="agents_engsample_dep_ts"),  # charts
            models.Index(fields=["ts"], name="agents_engsample_ts"),  # retention
        ]


class EngineMinute(models.Model):
    """A deployment's engine samples within one minute.

    Counts are summed, up to 2**31-1 (``gpu_agent.schema.MAX_COUNT``: the most their 32-bit columns
    hold); p50s are count-weighted means and p99s maxima of the per-window values (an upper bound of
    the minute's true p99); gauges are means; cumulative counters are maxima.
    """

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="+")
    minute = models.DateTimeField()
    samples = models.PositiveIntegerField()
    state = models.CharField(max_length=16)  # last
    ttft_count = models.PositiveIntegerField(default=0)
    ttft_p50 = models.FloatField(null=True)
    ttft_p99 = models.FloatField(null=True)
    itl_count = models.PositiveIntegerField(default=0)
    itl_p50 = models.FloatField(null=True)
    itl_p99 = models.FloatField(null=True)
    kv_cache_usage = models.FloatField(null=True)
    running = models.FloatField(default=0)
    waiting = models.FloatField(default=0)
    preemptions_total = models.PositiveBigIntegerField(default=0)
    bytes_offloaded = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["deployment", "minute"], name="agents_engminute_unique")
        ]
        indexes = [models.Index(fields=["minute"], name="agents_engminute_minute")]  # retention
