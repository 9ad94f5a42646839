"""Aqua profiler: highest request rate under a latency SLA, producer/consumer role, swap space.

Entry point for the job layer:
    profile_model(model, probe, sla, workload, config, progress=..., should_cancel=...) -> Profile
with probe = SimulatorProbe(cost, engine_config, workload, gpu=...) or an EngineProbe (real engine, agent).
"""

from serving.profiler.config import (
    LatencySLA,
    ProfilerConfig,
    ProfilingCancelled,
    ProfilingError,
    WorkloadSpec,
)
from serving.profiler.engine_probe import EngineProbe
from serving.profiler.probe import BurstResult, ProbeResult, RateProbe
from serving.profiler.profile import Profile, model_profile_from_dict
from serving.profiler.profiler import profile_model
from serving.profiler.search import RateSearch, SearchResult
from serving.profiler.sim_probe import SimulatorProbe

__all__ = [
    "BurstResult",
    "EngineProbe",
    "LatencySLA",
    "ProbeResult",
    "Profile",
    "ProfilerConfig",
    "ProfilingCancelled",
    "ProfilingError",
    "RateProbe",
    "RateSearch",
    "SearchResult",
    "SimulatorProbe",
    "WorkloadSpec",
    "model_profile_from_dict",
    "profile_model",
]
