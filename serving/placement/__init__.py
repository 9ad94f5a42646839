"""Aqua placement: spread producers and consumers over servers (ILP), pair them inside a server.

Entry points for the job layer:
    get_placer("cp-sat" | "greedy", PlacerConfig(...)).place(models, servers, progress=..., should_cancel=...)
    require_profiles(names, profiles)   -> profiles, or PlacementError naming models without one
    fewest_moves(current, plan)         -> (relabelled plan, moves)
"""

from serving.placement.base import CancelFn, Placer, ProgressFn
from serving.placement.diff import CurrentPlacement, Move, diff, fewest_moves, relabel_for_fewest_moves
from serving.placement.inputs import (
    ModelProfile,
    PlacementCancelled,
    PlacementError,
    PlacerConfig,
    ServerSpec,
)
from serving.placement.instance import PlacementInstance, require_profiles
from serving.placement.plan import Assignment, DramFallback, Pairing, Plan, ServerSummary
from serving.placement.registry import available_placers, get_placer, register_placer

__all__ = [
    "Assignment",
    "CancelFn",
    "CurrentPlacement",
    "DramFallback",
    "ModelProfile",
    "Move",
    "Pairing",
    "PlacementCancelled",
    "PlacementError",
    "PlacementInstance",
    "Placer",
    "PlacerConfig",
    "Plan",
    "ProgressFn",
    "ServerSpec",
    "ServerSummary",
    "available_placers",
    "diff",
    "fewest_moves",
    "get_placer",
    "register_placer",
    "relabel_for_fewest_moves",
    "require_profiles",
]
