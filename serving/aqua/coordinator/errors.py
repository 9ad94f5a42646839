"""Typed errors of the Aqua coordinator protocol.

Every refusal the coordinator makes is one of these classes. The server sends the class name as
the error `code`; the client raises the same class again, so a caller writes
`except NotOwner:` whether it talks to an in-process `Coordinator` or to a server over a socket.
"""

from __future__ import annotations


class CoordinatorError(Exception):
    """Base class of every coordinator refusal and client-side failure."""

    @property
    def code(self) -> str:
        return type(self).__name__


class InvalidArgument(CoordinatorError, ValueError):
    """A request is malformed: a non-positive size, a bad type, an unknown operation."""


class UnknownRegion(CoordinatorError, LookupError):
    """No leased region has this id (never leased, unleased, or withdrawn and emptied)."""


class UnknownAllocation(CoordinatorError, LookupError):
    """No live allocation has this id (never made, or already freed)."""


class NotOwner(CoordinatorError, PermissionError):
    """The caller may not act on this region or allocation (another producer's region, another
    consumer's allocation)."""


class RegionBusy(CoordinatorError):
    """The region still holds allocations: unlease refused, or resize would cut one off."""


class InsufficientMemory(CoordinatorError):
    """No region can hold the request in one piece (raised only when the caller asks for it)."""


class SessionLimit(CoordinatorError):
    """The session already holds as many leases or allocations as one session may (the message
    names the limit and its setting): unlease or free some first."""


class ProtocolError(CoordinatorError):
    """A frame could not be decoded, or a reply did not match its request."""


class CoordinatorUnavailable(CoordinatorError, ConnectionError):
    """The coordinator cannot be reached, or the connection to it was lost or timed out."""


class CallInFlight(CoordinatorError):
    """Client side only: a call made with `wait=False` was not sent, because another thread's call
    on the same client was waiting for its reply. The session is untouched; try again later."""


ERRORS: dict[str, type[CoordinatorError]] = {
    cls.__name__: cls
    for cls in (
        CoordinatorError,
        InvalidArgument,
        UnknownRegion,
        UnknownAllocation,
        NotOwner,
        RegionBusy,
        InsufficientMemory,
        SessionLimit,
        ProtocolError,
        CoordinatorUnavailable,
    )
}


def error_from_code(code: str, message: str) -> CoordinatorError:
    """Rebuild the typed error a server reported; an unknown code becomes a plain CoordinatorError."""
    return ERRORS.get(code, CoordinatorError)(message)
