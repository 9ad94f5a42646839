"""The Aqua host coordinator: state machine, Unix-socket server and the aqua-lib client.

    from serving.aqua.coordinator import AquaClient, Coordinator, CoordinatorServer

See `coordinator.py` for the protocol's rules, `client.py` for the client API and `errors.py` for
the typed refusals.
"""

from __future__ import annotations

from serving.aqua.coordinator.client import AquaClient
from serving.aqua.coordinator.coordinator import ALIGNMENT, Coordinator
from serving.aqua.coordinator.errors import (
    CallInFlight,
    CoordinatorError,
    CoordinatorUnavailable,
    InsufficientMemory,
    InvalidArgument,
    NotOwner,
    ProtocolError,
    RegionBusy,
    SessionLimit,
    UnknownAllocation,
    UnknownRegion,
)
from serving.aqua.coordinator.limits import SessionLimits
from serving.aqua.coordinator.records import Allocation, ReclaimStatus
from serving.aqua.coordinator.server import CoordinatorServer

__all__ = [
    "ALIGNMENT",
    "Allocation",
    "AquaClient",
    "CallInFlight",
    "Coordinator",
    "CoordinatorError",
    "CoordinatorServer",
    "CoordinatorUnavailable",
    "InsufficientMemory",
    "InvalidArgument",
    "NotOwner",
    "ProtocolError",
    "ReclaimStatus",
    "RegionBusy",
    "SessionLimit",
    "SessionLimits",
    "UnknownAllocation",
    "UnknownRegion",
]
