"""What the placer is given: model profiles, server specs and solver settings, plus its errors.

A model runs on `tp` GPUs of one server (tensor parallelism never crosses a server). A producer
has idle memory to lend (`lendable_bytes`); a consumer needs extra KV space at its burst level
(`needed_bytes`); a neutral model does neither (a profiled consumer whose bursts fit its own KV
cache at the level placed for): it only takes GPUs. The profiler (serving/profiler) produces these
figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["producer", "consumer", "neutral"]
ROLES: tuple[Role, ...] = ("producer", "consumer", "neutral")


class PlacementError(ValueError):
    """The placement instance is invalid or infeasible; nothing was placed."""


class PlacementCancelled(RuntimeError):
    """The caller's `should_cancel` returned True while the placer was running."""


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """One model as the placer sees it.

    Attributes:
        name: Unique model name; ties are broken by it.
        role: "producer" (lends memory), "consumer" (borrows memory under bursts) or "neutral"
            (neither: it adds nothing to its server's memory or role balance and is never paired).
        tp: Tensor-parallel degree: the model occupies this many GPUs of one server.
        lendable_bytes: Bytes a producer can lend (free memory at its max rate minus a safety
            margin); must be positive for a producer, and is ignored for a consumer.
        needed_bytes: Bytes a consumer must swap out at its burst level; must be positive for a
            consumer, and is ignored for a producer. A neutral model has neither (both 0).
        max_rps: The highest request rate meeting the model's SLA (informational).
        weights_bytes: Bytes of the model's weights, over all its `tp` GPUs; 0 when unknown.
        min_kv_bytes: Bytes of the smallest KV cache it can run with (one request of its
            context length), over all its GPUs; 0 when unknown.
            A model is only placed on a server whose GPUs each hold its share of both
            (`gpu_memory_needed_bytes`); with both 0 any GPU is taken to hold it.
    """

    name: str
    role: Role
    tp: int = 1
    lendable_bytes: int = 0
    needed_bytes: int = 0
    max_rps: float | None = None
    weights_bytes: int = 0
    min_kv_bytes: int = 0

    def __post_init__(self) -> None:
        if not self.name:
            raise PlacementError("a model profile needs a non-empty name")
        if self.role not in ROLES:
            raise PlacementError(
                f"model {self.name!r}: {self.role=} must be 'producer', 'consumer' or 'neutral'"
            )
        if self.tp < 1:
            raise PlacementError(f"model {self.name!r}: {self.tp=} must be positive")
        if self.lendable_bytes < 0:
            raise PlacementError(f"model {self.name!r}: {self.lendable_bytes=} must be >= 0")
        if self.needed_bytes < 0:
            raise PlacementError(f"model {self.name!r}: {self.needed_bytes=} must be >= 0")
        if self.weights_bytes < 0:
            raise PlacementError(f"model {self.name!r}: {self.weights_bytes=} must be >= 0")
        if self.min_kv_bytes < 0:
            raise PlacementError(f"model {self.name!r}: {self.min_kv_bytes=} must be >= 0")
        if self.role == "producer" and self.lendable_bytes <= 0:
            raise PlacementError(f"model {self.name!r}: a producer's {self.lendable_bytes=} must be positive")
        if self.role == "consumer" and self.needed_bytes <= 0:
            raise PlacementError(f"model {self.name!r}: a consumer's {self.needed_bytes=} must be positive")
        if self.role == "neutral" and (self.lendable_bytes or self.needed_bytes):
            raise PlacementError(
                f"model {self.name!r}: a neutral model lends and needs nothing, not "
                f"{self.lendable_bytes=}, {self.needed_bytes=}"
            )

    @property
    def gpu_memory_needed_bytes(self) -> int:
        """Memory each of its GPUs must have: its share of the weights and the minimal KV cache
        (tensor parallelism splits both over the `tp` GPUs); 0 when neither is known."""
        return -(-(self.weights_bytes + self.min_kv_bytes) // self.tp)

    @property
    def balance_bytes(self) -> int:
        """Signed contribution to its server's memory balance: +lendable, -needed, or 0 (neutral)."""
        if self.role == "neutral":
            return 0
        return self.lendable_bytes if self.role == "producer" else -self.needed_bytes

    def lendable_on(self, gpu_memory_bytes: int, nvlink: bool) -> int:
        """What it can lend on a server of GPUs of `gpu_memory_bytes` each, joined by NVLink or not:
        its profile's figure, at most the memory of its `tp` GPUs (a profile measured on larger
        GPUs, e.g. a simulator preset of an 80 GB H100, lent 40 GiB from one 24 GB GPU), and
        nothing without NVLink (pairing lends only inside an NVLink domain). Pairing lends this,
        and the placer balances it."""
        return min(self.lendable_bytes, self.tp * gpu_memory_bytes) if nvlink else 0

    def balance_on(self, gpu_memory_bytes: int, nvlink: bool) -> int:
        """`balance_bytes` on a server of GPUs of `gpu_memory_bytes` each, with or without NVLink:
        a producer's lending is `lendable_on` (capped, and 0 without NVLink)."""
        if self.role == "producer":
            return self.lendable_on(gpu_memory_bytes, nvlink)
        return self.balance_bytes

    @property
    def role_sign(self) -> int:
        """Contribution to its server's role balance: +1 producer, -1 consumer, 0 neutral."""
        return {"producer": 1, "consumer": -1}.get(self.role, 0)


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One server (one NVLink domain when `nvlink`).

    Attributes:
        name: Unique server name.
        num_gpus: GPUs in the server.
        gpu_memory_bytes: Memory of each GPU.
        nvlink: Whether the GPUs are joined by NVLink; lending is only paired on NVLink servers,
            so a producer there counts as lending nothing (`ModelProfile.lendable_on`).
    """

    name: str
    num_gpus: int
    gpu_memory_bytes: int
    nvlink: bool = True

    def __post_init__(self) -> None:
        if not self.name:
            raise PlacementError("a server spec needs a non-empty name")
        if self.num_gpus < 1:
            raise PlacementError(f"server {self.name!r}: {self.num_gpus=} must be positive")
        if self.gpu_memory_bytes <= 0:
            raise PlacementError(f"server {self.name!r}: {self.gpu_memory_bytes=} must be positive")

    @property
    def kind(self) -> tuple[int, int, bool]:
        """Servers of the same kind are interchangeable."""
        return (self.num_gpus, self.gpu_memory_bytes, self.nvlink)


@dataclass(frozen=True, slots=True)
class PlacerConfig:
    """Solver settings.

    Attributes:
        time_limit_s: Wall-clock cap on the CP-SAT placer's whole solve (hint, ILP and search);
            its search stops earlier, after a deterministic amount of work (serving/placement/cpsat.py).
        num_workers: CP-SAT search workers (threads).
        balance_unit_bytes: Byte sizes are divided by this and rounded to integers for the ILP
            (CP-SAT is integer-only); pairing uses exact bytes.
        role_weight_units: Weight of one unit of role imbalance, in balance units; None means the
            mean |balance| of the models (one surplus producer or consumer costs as much as an
            average model's memory).
        relative_gap_limit: Stop once (objective - bound) / objective is at most this.
        seed: CP-SAT random seed.
    """

    time_limit_s: float = 10.0
    num_workers: int = 2
    balance_unit_bytes: int = 1 << 20
    role_weight_units: int | None = None
    relative_gap_limit: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.time_limit_s > 0:  # also refuses nan
            raise ValueError(f"{self.time_limit_s=} must be positive")
        if self.num_workers < 1:
            raise ValueError(f"{self.num_workers=} must be positive")
        if self.balance_unit_bytes < 1:
            raise ValueError(f"{self.balance_unit_bytes=} must be positive")
        if self.role_weight_units is not None and self.role_weight_units < 0:
            raise ValueError(f"{self.role_weight_units=} must be >= 0")
        if not 0.0 <= self.relative_gap_limit < 1.0:
            raise ValueError(f"{self.relative_gap_limit=} must be in [0, 1)")
