"""``noop``: N steps with a delay each. Proves the enqueue -> worker -> progress -> result path."""

from __future__ import annotations

import time
from typing import Any

from rest_framework import serializers

from core.serializers import FloatField, IntegerField
from jobs.kinds.params import StrictParams
from jobs.registry import JobContext, JobKind, register


class NoopParams(StrictParams):
    steps = IntegerField(min_value=1, max_value=100_000, default=5)
    delay_s = FloatField(min_value=0.0, max_value=60.0, default=0.1)
    fail_at_step = IntegerField(
        min_value=1,
        max_value=100_000,
        required=False,
        help_text="raise an error at this step (exercises failure handling)",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # A step past the last one never came: the job asked to fail succeeded instead.
        fail_at, steps = attrs.get("fail_at_step"), attrs["steps"]
        if fail_at is not None and fail_at > steps:
            raise serializers.ValidationError(
                {"fail_at_step": [f"Step {fail_at} is past the last step ({steps}); the job would not fail."]}
            )
        return attrs


def run_noop(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    steps: int = params["steps"]
    fail_at: int | None = params.get("fail_at_step")
    for step in range(1, steps + 1):
        ctx.check_cancelled()
        time.sleep(params["delay_s"])
        if step == fail_at:
            raise RuntimeError(f"noop failed at step {step} as asked (fail_at_step={fail_at})")
        ctx.progress(step / steps)
    return {"steps_done": steps}


NOOP = register(
    JobKind(
        name="noop",
        params_serializer=NoopParams,
        run=run_noop,
        description="Sleep `delay_s` seconds `steps` times, reporting progress after each step.",
    )
)
