"""Choosing a replica: fewest outstanding requests first, recently failed replicas last.

Outstanding counts live in this process only. With several ASGI processes each balances its own
requests, and together they are balanced only as well as the processes' shares of traffic are;
a shared counter (Redis) would fix that at the cost of a round trip per request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Target:
    """A replica the gateway may send a request to."""

    replica_id: int
    deployment_id: int
    base_url: str  # http://host:port of the engine's OpenAI server
    # The engine's key (deployments.engine_keys), sent as a bearer token; "" sends none.
    api_key: str = field(default="", repr=False)

    def headers(self) -> dict[str, str]:
        """The headers of a request to the engine: JSON, and the engine's key."""
        headers = {"content-type": "application/json"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        return headers


class Router:
    """In-process load state of replicas: outstanding requests and recent failures."""

    def __init__(self, failure_penalty_s: float = 5.0) -> None:
        self.failure_penalty_s = failure_penalty_s
        self._outstanding: dict[int, int] = {}  # replica id -> requests in flight through us
        self._failed_until: dict[int, float] = {}  # replica id -> monotonic time its penalty ends

    def outstanding(self, replica_id: int) -> int:
        return self._outstanding.get(replica_id, 0)

    def order(self, targets: list[Target], now: float | None = None) -> list[Target]:
        """The order to try ``targets`` in: not recently failed first, then fewest outstanding,
        ties by replica id (deterministic)."""
        now = time.monotonic() if now is None else now

        def rank(t: Target) -> tuple[bool, int, int]:
            return (
                self._failed_until.get(t.replica_id, 0.0) > now,
                self.outstanding(t.replica_id),
                t.replica_id,
            )

        return sorted(targets, key=rank)

    def acquire(self, target: Target) -> None:
        self._outstanding[target.replica_id] = self.outstanding(target.replica_id) + 1

    def release(self, target: Target) -> None:
        left = self.outstanding(target.replica_id) - 1
        if left > 0:
            self._outstanding[target.replica_id] = left
        else:
            self._outstanding.pop(target.replica_id, None)

    def failed(self, target: Target, now: float | None = None) -> None:
        """``target`` failed before or while answering: try others first for a while."""
        now = time.monotonic() if now is None else now
        self._failed_until[target.replica_id] = now + self.failure_penalty_s
