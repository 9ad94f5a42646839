"""Planning operations (the app's service layer), one module each:

profiling.run_profile(params, ctx)   the `profile` job: model -> curve + ModelProfile
placing.run_place(params, ctx)       the `place` job: profiles + hosts -> PlacementPlan + diff
applying.apply_plan(job, user)       a stored plan -> deployments, fewest moves
engine_probe.AgentEngineProbe        serving's EngineProbe through a host's agent
relay.relay_probes / store_probe_result   the ASGI side of those probes
"""

from __future__ import annotations

from planning.applying import ApplyOutcome, PlanConflict, PlanNotApplicable, apply_plan
from planning.engine_probe import AgentEngineProbe
from planning.placing import current_placement, fingerprint, run_place
from planning.profiling import run_profile, simulator_probe
from planning.relay import relay_probes, store_probe_result

__all__ = [
    "AgentEngineProbe",
    "ApplyOutcome",
    "PlanConflict",
    "PlanNotApplicable",
    "apply_plan",
    "current_placement",
    "fingerprint",
    "relay_probes",
    "run_place",
    "run_profile",
    "simulator_probe",
    "store_probe_result",
]
