"""Turn a model -> server assignment into a Plan: GPU indices, pairings, fallbacks, summaries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from serving.placement.gpus import allocate_gpus
from serving.placement.inputs import PlacementError
from serving.placement.instance import PlacementInstance
from serving.placement.pairing import Placed, pair_within_server
from serving.placement.plan import Assignment, DramFallback, Pairing, Plan, ServerSummary, SolveStatus


def assemble_plan(
    instance: PlacementInstance,
    assignment: Sequence[int],
    *,
    best_bound: int,
    status: SolveStatus,
    solver: str,
    solve_seconds: float,
    preferred_gpus: Mapping[str, Sequence[int]] | None = None,
) -> Plan:
    """Build the Plan for `assignment` (server index per model, in instance model order).

    Args:
        instance: The validated instance.
        assignment: assignment[m] is the index of model m's server.
        best_bound: A proven lower bound on the objective.
        status: Solve status to record.
        solver: Name of the placer that produced the assignment.
        solve_seconds: Wall time spent.
        preferred_gpus: model -> GPU indices to keep where valid (see allocate_gpus).

    Raises:
        PlacementError: The assignment is incomplete or overfills a server.
    """
    if len(assignment) != instance.num_models:
        raise PlacementError(f"assignment covers {len(assignment)} of {instance.num_models} models")
    if not instance.fits(assignment):
        raise PlacementError("assignment puts more GPUs' worth of models on a server than it has")
    on_server: list[list[int]] = [[] for _ in instance.servers]
    for m, s in enumerate(assignment):
        on_server[s].append(m)

    assignments: dict[str, Assignment] = {}
    pairings: list[Pairing] = []
    fallbacks: list[DramFallback] = []
    summaries: list[ServerSummary] = []
    for s, server in enumerate(instance.servers):
        models = [instance.models[m] for m in on_server[s]]
        gpus = allocate_gpus(server.num_gpus, [(p.name, p.tp) for p in models], preferred_gpus)
        producers: list[Placed] = [(p, gpus[p.name]) for p in models if p.role == "producer"]
        consumers: list[Placed] = [(p, gpus[p.name]) for p in models if p.role == "consumer"]
        for p in models:
            assignments[p.name] = Assignment(p.name, server.name, gpus[p.name])
        got_pairs, got_fallbacks = pair_within_server(server, producers, consumers)
        pairings += got_pairs
        fallbacks += got_fallbacks
        summaries.append(
            ServerSummary(
                server=server.name,
                gpus_used=sum(p.tp for p in models),
                num_gpus=server.num_gpus,
                memory_balance_bytes=sum(
                    p.balance_on(server.gpu_memory_bytes, server.nvlink) for p in models
                ),
                role_balance=sum(p.role_sign for p in models),
            )
        )
    return Plan(
        assignments=assignments,
        pairings=tuple(pairings),
        dram_fallbacks=tuple(fallbacks),
        servers=instance.servers,
        server_summaries=tuple(summaries),
        objective=instance.objective(assignment),
        best_bound=best_bound,
        status=status,
        solver=solver,
        solve_seconds=solve_seconds,
        unit_bytes=instance.unit_bytes,
        role_weight=instance.role_weight,
    )
