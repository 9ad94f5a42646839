"""Messages between the connector's scheduler side and its worker side."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)


@dataclass(frozen=True)
class SaveJob:
    """Offload a preempted request: its first `len(block_ids)` blocks hold `num_tokens` tokens."""

    req_id: str
    block_ids: list[int]
    num_tokens: int


@dataclass(frozen=True)
class LoadJob:
    """Restore blocks [first, first + len(block_ids)) of the saved buffer (of `saved_blocks`)."""

    req_id: str
    block_ids: list[int]
    first: int
    saved_blocks: int


@dataclass
class AquaConnectorMetadata(KVConnectorMetadata):
    """One engine step's jobs; saves run before loads (both before the forward pass)."""

    saves: list[SaveJob] = field(default_factory=list)
    loads: list[LoadJob] = field(default_factory=list)
    drops: list[str] = field(default_factory=list)


@dataclass
class AquaWorkerMetadata(KVConnectorWorkerMetadata):
    """Offloads the worker could not keep (no room, or evacuation failed): recompute those."""

    lost: set[str] = field(default_factory=set)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, AquaWorkerMetadata)
        return AquaWorkerMetadata(lost=self.lost | other.lost)
