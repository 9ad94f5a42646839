"""Per-session caps on what one client session may hold in the coordinator.

Without them one session (a buggy or hostile client on the socket) could lease or allocate
without end: the coordinator's memory grows, every allocate and stats call walks the lot, and a
stats reply outgrows the frame limit for everyone. A session at its cap is refused with
`SessionLimit`, naming the cap; other sessions are unaffected. What a session holds goes back
under the cap as it unleases or frees, and is forgotten when it disconnects.

Real sessions hold little: a producer leases a region per device it lends from, an engine's
offload store one allocation (two while it trades a piece up, a few more while regions it cannot
attach wait to be freed). Pending requests need no cap: the server answers one request of a
connection at a time and stops reading from a client that does not read its replies.

The in-process host (`LOCAL_SESSION`: calls made straight on the `Coordinator` object, or through
`CoordinatorServer.call`) is trusted and not capped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from serving.aqua.coordinator.errors import SessionLimit

DEFAULT_MAX_LEASES = 64
DEFAULT_MAX_ALLOCATIONS = 1024


@dataclass(frozen=True)
class SessionLimits:
    """What one client session may hold at once."""

    max_leases: int = field(
        default=DEFAULT_MAX_LEASES,
        metadata={"help": f"regions one session may have leased at once (default {DEFAULT_MAX_LEASES})"},
    )
    max_allocations: int = field(
        default=DEFAULT_MAX_ALLOCATIONS,
        metadata={"help": f"allocations one session may hold at once (default {DEFAULT_MAX_ALLOCATIONS})"},
    )

    def __post_init__(self) -> None:
        for name in ("max_leases", "max_allocations"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")


class SessionQuota:
    """Counts one kind of thing (`what`) per session against `limit`.

    Args:
        what: What is counted, as the refusal names it ("leases", "allocations").
        option: The setting that sets `limit`, as the refusal names it.
        limit: The most one session may hold.
        exempt: A session that is never capped (the in-process host).
    """

    def __init__(self, what: str, option: str, limit: int, exempt: str) -> None:
        self.what, self.option, self.limit, self.exempt = what, option, limit, exempt
        self._held: Counter[str] = Counter()  # session -> how many it holds

    def check(self, session: str) -> None:
        """Raise SessionLimit if `session` may not take one more."""
        if session != self.exempt and self._held[session] >= self.limit:
            raise SessionLimit(
                f"session {session} holds {self._held[session]} {self.what}: "
                f"the limit is {self.option}={self.limit}; release some first"
            )

    def take(self, session: str) -> None:
        self._held[session] += 1

    def give(self, session: str) -> None:
        self._held[session] -= 1
        if self._held[session] <= 0:
            del self._held[session]

    def forget(self, session: str) -> None:
        """The session is gone: what it held no longer counts."""
        self._held.pop(session, None)

    def held(self, session: str) -> int:
        return self._held[session]

    def snapshot(self) -> dict[str, int]:
        """session -> count, for invariant checks."""
        return dict(self._held)
