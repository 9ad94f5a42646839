"""Scheduling policies shared by the simulator and the vLLM plug-in."""

from serving.policies.base import SchedContext, SchedRequest, SchedulingPolicy
from serving.policies.registry import available_policies, get_policy, register_policy

__all__ = [
    "SchedContext",
    "SchedRequest",
    "SchedulingPolicy",
    "available_policies",
    "get_policy",
    "register_policy",
]
