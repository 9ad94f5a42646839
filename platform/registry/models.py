"""Served models: what the platform can deploy, with the SLOs it must meet."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction

from registry.validators import (
    validate_engine_options,
    validate_percentage,
    validate_positive,
    validate_power_of_two,
)

# The longest context a model may declare, in tokens (16,777,216): above the longest context
# windows published (Llama 4 Scout's 10M tokens), and well inside the column (a PostgreSQL integer
# holds up to 2**31 - 1; SQLite stores any size, so unbounded, a value PostgreSQL refuses passed there).
MAX_CONTEXT_LENGTH = 1 << 24
# The shortest: a request is at least one prompt token and one output token. vLLM starts with a
# --max-model-len of 1 (vllm/config/model.py checks only >= 1) but then refuses every generation
# request, whose prompt plus at least one output token exceeds it (v1/engine/input_processor.py);
# the serving simulator's workloads need 2 as well (serving/workload/lengths.py). The database
# constraint stays at >= 1, so rows stored before this minimum still migrate; a profile job of
# such a model is refused when posted (planning.profiling.context_of).
MIN_CONTEXT_LENGTH = 2


class DType(models.TextChoices):
    AUTO = "auto", "auto (from the checkpoint)"
    FLOAT16 = "float16", "float16"
    BFLOAT16 = "bfloat16", "bfloat16"
    FLOAT32 = "float32", "float32"


class ServedModel(models.Model):
    """A model the platform serves.

    ``source`` is a local path or a hub id (``org/name``). The SLO targets are what profiling and
    placement aim for: P99 time to first token, P99 time between tokens, and the share of
    requests that must meet both.
    """

    name = models.SlugField(max_length=100, unique=True)
    source = models.CharField(max_length=500)
    dtype = models.CharField(max_length=16, choices=DType.choices, default=DType.AUTO)
    tensor_parallel_size = models.PositiveSmallIntegerField(
        default=1, validators=[validate_power_of_two, MaxValueValidator(64)]
    )
    max_context_length = models.PositiveIntegerField(
        validators=[MinValueValidator(MIN_CONTEXT_LENGTH), MaxValueValidator(MAX_CONTEXT_LENGTH)]
    )
    slo_ttft_p99_ms = models.FloatField(validators=[validate_positive])
    slo_tbt_p99_ms = models.FloatField(validators=[validate_positive])
    slo_attainment_pct = models.FloatField(default=90.0, validators=[validate_percentage])
    engine_options = models.JSONField(default=dict, blank=True, validators=[validate_engine_options])
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=models.Q(tensor_parallel_size__gte=1), name="model_tp_positive"),
            models.CheckConstraint(condition=models.Q(max_context_length__gte=1), name="model_ctx_positive"),
            models.CheckConstraint(condition=models.Q(slo_ttft_p99_ms__gt=0), name="model_ttft_positive"),
            models.CheckConstraint(condition=models.Q(slo_tbt_p99_ms__gt=0), name="model_tbt_positive"),
            models.CheckConstraint(
                condition=models.Q(slo_attainment_pct__gt=0, slo_attainment_pct__lte=100),
                name="model_attainment_pct_range",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        with transaction.atomic():
            lock_for_delete([self.pk])
            return super().delete(*args, **kwargs)


def lock_for_delete(pks: Iterable[Any]) -> None:
    """Lock these models' profile rows, then their own rows (FOR UPDATE, in primary-key order),
    until the caller's transaction ends: the order storing a profile takes them in
    (``planning.profiling.store_profile``), before a delete's cascade looks for what refers to
    them. So a profile stored meanwhile is stored first and deleted with the model (a first
    profile too, which the cascade would otherwise miss and the delete fail on at commit), and the
    two never wait for each other's rows (PostgreSQL would abort one as a deadlock)."""
    from planning.models import ModelProfile  # planning builds on registry

    pks = list(pks)
    list(ModelProfile.objects.select_for_update().filter(model_id__in=pks).order_by("pk").values_list("pk"))
    list(ServedModel.objects.select_for_update().filter(pk__in=pks).order_by("pk").values_list("pk"))
