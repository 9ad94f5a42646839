"""``place``: Aqua placement of every profiled model over every host; a plan and its diff.

The work is in planning.placing; this module declares the parameters and registers the kind.
Apply a succeeded job's plan with ``POST /api/v1/plans/<job id>/apply/``.
"""

from __future__ import annotations

from typing import Any

from planning.models import ModelProfile
from planning.placing import run_place
from registry.models import ServedModel
from rest_framework import serializers

from core.serializers import FloatField
from jobs.kinds.params import MAX_BURST_LEVEL, StrictParams
from jobs.registry import JobContext, JobKind, register
from serving.placement import PlacementError
from serving.profiler import ProfilingError

MAX_PLACE_MODELS = 1000
UNKNOWN_NAMED = 10  # unknown names a refusal spells out


class PlaceParams(StrictParams):
    solver = serializers.ChoiceField(choices=["cp-sat", "greedy"], default="cp-sat")
    time_limit_s = FloatField(min_value=0.1, max_value=600.0, default=10.0)
    burst_level = FloatField(
        min_value=1.0,
        max_value=MAX_BURST_LEVEL,
        default=4.0,
        help_text="the burst level (x max rate) consumers are placed for",
    )
    # An empty list is an error, not "all models": a client that filtered its selection down to
    # nothing did not mean to place (and move) every model. Leave the key out to place them all.
    # Bounded: the names are looked up in one query, and each unknown one was echoed back (70,000
    # names gave a 400 of 700 kB naming every one).
    models = serializers.ListField(
        child=serializers.SlugField(max_length=ServedModel._meta.get_field("name").max_length),
        required=False,
        allow_empty=False,
        max_length=MAX_PLACE_MODELS,
        help_text="place only these models, each profiled (default, when left out: every profiled model)",
    )

    def validate_models(self, value: list[str]) -> list[str]:
        # Checked here so that the client hears of it at once; run_place checks again, as a profile
        # can be deleted (or its model replaced) between the POST and the run.
        known = set(ServedModel.objects.filter(name__in=value).values_list("name", flat=True))
        unknown = sorted(set(value) - known)
        if unknown:
            raise serializers.ValidationError(f"No served model named {_named(unknown)}.")
        profiled = set(
            ModelProfile.objects.filter(model__name__in=value).values_list("model__name", flat=True)
        )
        unprofiled = sorted(set(value) - profiled)
        if unprofiled:
            raise serializers.ValidationError(
                f"No profile for {_named(unprofiled)}; run a profile job for each, then place."
            )
        return value


def _named(names: list[str]) -> str:
    """The first UNKNOWN_NAMED of `names`, quoted, and how many more there are."""
    named = ", ".join(map(repr, names[:UNKNOWN_NAMED]))
    more = f" and {len(names) - UNKNOWN_NAMED} more" if len(names) > UNKNOWN_NAMED else ""
    return f"{named}{more}"


def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    return run_place(params, ctx)


PLACE = register(
    JobKind(
        name="place",
        params_serializer=PlaceParams,
        run=run,
        expected_errors=(PlacementError, ProfilingError),
        description="Place every profiled model on the hosts' GPUs (ILP), pair producers with consumers; "
        "the result is a plan and its diff against the deployments (models without a profile are left "
        "alone and listed in left_out).",
    )
)
