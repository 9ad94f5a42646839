"""A placement plan: where each model runs, who lends to whom, who falls back to host DRAM."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from serving.placement.inputs import ServerSpec

SolveStatus = Literal["optimal", "feasible", "heuristic"]


@dataclass(frozen=True, slots=True)
class Assignment:
    """Model `model` runs on GPUs `gpus` (sorted indices) of server `server`."""

    model: str
    server: str
    gpus: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "server": self.server, "gpus": list(self.gpus)}


@dataclass(frozen=True, slots=True)
class Pairing:
    """Producer `lender` lends `nbytes` to consumer `borrower`, both on `server` (over NVLink).

    Attributes:
        server: The server (NVLink domain) both run on.
        lender: The producer model.
        lender_gpus: The producer's GPUs (where the lent memory lives).
        borrower: The consumer model.
        borrower_gpus: The consumer's GPUs.
        nbytes: Bytes lent: the consumer's need, which the lender covers.
        lendable_bytes: What the lender could lend in all (>= nbytes): its profile's figure, at most
            the memory of its GPUs on the server.
    """

    server: str
    lender: str
    lender_gpus: tuple[int, ...]
    borrower: str
    borrower_gpus: tuple[int, ...]
    nbytes: int
    lendable_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "lender": self.lender,
            "lender_gpus": list(self.lender_gpus),
            "borrower": self.borrower,
            "borrower_gpus": list(self.borrower_gpus),
            "bytes": self.nbytes,
            "lendable_bytes": self.lendable_bytes,
        }


@dataclass(frozen=True, slots=True)
class DramFallback:
    """Consumer `model` gets no lender on its server and swaps `needed_bytes` to host DRAM."""

    model: str
    server: str
    gpus: tuple[int, ...]
    needed_bytes: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "server": self.server,
            "gpus": list(self.gpus),
            "needed_bytes": self.needed_bytes,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class ServerSummary:
    """A server's balances under the plan (exact bytes, not balance units)."""

    server: str
    gpus_used: int
    num_gpus: int
    memory_balance_bytes: int
    role_balance: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "gpus_used": self.gpus_used,
            "num_gpus": self.num_gpus,
            "memory_balance_bytes": self.memory_balance_bytes,
            "role_balance": self.role_balance,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """The result of a placer.

    Attributes:
        assignments: model name -> where it runs (every model of the instance).
        pairings: Producer -> consumer loans, one-to-one, inside a server; in server order, then by lender.
        dram_fallbacks: Consumers without a lender; in server order, then by model.
        servers: The servers placed on (their kinds drive fewest-moves relabelling).
        server_summaries: Per-server balances, in `servers` order.
        objective: The objective in balance units (serving/placement/instance.py docstring).
        best_bound: A proven lower bound on the objective (CP-SAT's bound, or the aggregate bound).
        status: "optimal" (objective == proven bound), "feasible" (solver stopped early) or
            "heuristic" (greedy, no search).
        solver: The placer's registry name.
        solve_seconds: Wall time of the solve.
        unit_bytes: Bytes per balance unit.
        role_weight: Weight of the role term, in balance units.
        hint_objective: Objective of the starting solution handed to the solver (CP-SAT only), to
            show how much the search itself improved on it.
    """

    assignments: dict[str, Assignment]
    pairings: tuple[Pairing, ...]
    dram_fallbacks: tuple[DramFallback, ...]
    servers: tuple[ServerSpec, ...]
    server_summaries: tuple[ServerSummary, ...]
    objective: int
    best_bound: int
    status: SolveStatus
    solver: str
    solve_seconds: float
    unit_bytes: int
    role_weight: int
    hint_objective: int | None = None

    @property
    def gap(self) -> float:
        """Relative gap (objective - best_bound) / objective; 0 when proven optimal."""
        if self.objective <= 0:
            return 0.0
        return max(0.0, (self.objective - self.best_bound) / self.objective)

    @property
    def max_memory_imbalance_bytes(self) -> int:
        return max((abs(s.memory_balance_bytes) for s in self.server_summaries), default=0)

    @property
    def max_role_imbalance(self) -> int:
        return max((abs(s.role_balance) for s in self.server_summaries), default=0)

    def server_of(self, model: str) -> str:
        return self.assignments[model].server

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """Rebuild a plan stored with `to_dict` (derived fields such as gap are recomputed).

        Raises:
            ValueError: A field is missing or has the wrong shape.
        """
        try:
            servers = tuple(
                ServerSpec(s["name"], s["num_gpus"], s["gpu_memory_bytes"], s["nvlink"])
                for s in data["servers"]
            )
            assignments = {
                a["model"]: Assignment(a["model"], a["server"], tuple(a["gpus"])) for a in data["assignments"]
            }
            pairings = tuple(
                Pairing(
                    p["server"],
                    p["lender"],
                    tuple(p["lender_gpus"]),
                    p["borrower"],
                    tuple(p["borrower_gpus"]),
                    p["bytes"],
                    p["lendable_bytes"],
                )
                for p in data["pairings"]
            )
            fallbacks = tuple(
                DramFallback(f["model"], f["server"], tuple(f["gpus"]), f["needed_bytes"], f["reason"])
                for f in data["dram_fallbacks"]
            )
            summaries = tuple(
                ServerSummary(
                    s["server"], s["gpus_used"], s["num_gpus"], s["memory_balance_bytes"], s["role_balance"]
                )
                for s in data["server_summaries"]
            )
            return cls(
                assignments=assignments,
                pairings=pairings,
                dram_fallbacks=fallbacks,
                servers=servers,
                server_summaries=summaries,
                objective=data["objective"],
                best_bound=data["best_bound"],
                status=data["status"],
                solver=data["solver"],
                solve_seconds=data["solve_seconds"],
                unit_bytes=data["unit_bytes"],
                role_weight=data["role_weight"],
                hint_objective=data.get("hint_objective"),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a stored plan: {exc!r}") from exc

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (plain dicts, lists, ints, floats and strings)."""
        return {
            "solver": self.solver,
            "status": self.status,
            "objective": self.objective,
            "best_bound": self.best_bound,
            "gap": self.gap,
            "solve_seconds": self.solve_seconds,
            "unit_bytes": self.unit_bytes,
            "role_weight": self.role_weight,
            "hint_objective": self.hint_objective,
            "max_memory_imbalance_bytes": self.max_memory_imbalance_bytes,
            "max_role_imbalance": self.max_role_imbalance,
            "assignments": [self.assignments[k].to_dict() for k in sorted(self.assignments)],
            "pairings": [p.to_dict() for p in self.pairings],
            "dram_fallbacks": [f.to_dict() for f in self.dram_fallbacks],
            "servers": [
                {
                    "name": s.name,
                    "num_gpus": s.num_gpus,
                    "gpu_memory_bytes": s.gpu_memory_bytes,
                    "nvlink": s.nvlink,
                }
                for s in self.servers
            ],
            "server_summaries": [s.to_dict() for s in self.server_summaries],
        }
