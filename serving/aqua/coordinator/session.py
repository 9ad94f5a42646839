"""`CoordinatorSession`: one live `AquaClient` at a time, reopened with backoff after its session ends.

The host agent restarts its coordinator when the socket goes away: it ends every session (clients
see CoordinatorUnavailable, or `connected()` turns False) and starts a fresh, empty coordinator on
the same path. A long-lived engine must then open a new session rather than stay without one for
its whole life, but must not try to connect on every engine step while nothing listens.

Primitives:
    current()  the client while its session is up, else None; no round trip, never connects
    ensure()   current(), or, when the backoff allows, ONE connection attempt (no retry loop)
    close()

Whatever a caller got from an ended session (allocations, leased regions) ended with it: the new
session starts with nothing, and ids from the old one mean nothing to the new coordinator (which
numbers from 1 again), so they must never be sent on the new session.
"""

from __future__ import annotations

import logging
import math
import threading
import time

from serving.aqua.coordinator.client import AquaClient
from serving.aqua.coordinator.errors import CoordinatorUnavailable
from serving.backoff import Backoff

log = logging.getLogger(__name__)

RETRY_BASE_S = 0.25  # wait after the first failed attempt; doubles per failure ...
RETRY_CAP_S = 5.0  # ... up to this


class CoordinatorSession:
    """Holds a session with the coordinator at `socket_path` and opens a new one when it ends.

    Args:
        socket_path: The coordinator's Unix socket.
        name: The session's label in the coordinator (as `AquaClient(name=...)`).
        timeout: Seconds to wait for any one reply (as `AquaClient(timeout=...)`).
        connect_timeout: If given, open the first session now, retrying for this many seconds, and
            raise CoordinatorUnavailable if that fails; if None, the first `ensure()` tries once.
        retry_base_s: Wait after the first failed attempt; it doubles per failure up to `retry_cap_s`
            (no jitter: one engine's few sessions gain nothing from spreading).
        retry_cap_s: Longest wait between attempts.
    """

    def __init__(
        self,
        socket_path: str,
        name: str | None = None,
        *,
        timeout: float = 30.0,
        connect_timeout: float | None = None,
        retry_base_s: float = RETRY_BASE_S,
        retry_cap_s: float = RETRY_CAP_S,
    ) -> None:
        if not (timeout > 0 and math.isfinite(timeout)):  # also refuses nan
            raise ValueError(f"{timeout=} must be positive and finite")
        if not 0 < retry_base_s <= retry_cap_s:
            raise ValueError(f"{retry_base_s=} must be positive and at most {retry_cap_s=}")
        self._backoff = Backoff(base_s=retry_base_s, cap_s=retry_cap_s, jitter=False)
        self.socket_path = socket_path
        self.name = name
        self.timeout = timeout
        self.retry_base_s = retry_base_s
        self.retry_cap_s = retry_cap_s
        self._lock = threading.Lock()  # one connection attempt at a time
        self._client: AquaClient | None = None
        self._next_try = 0.0  # monotonic time before which no attempt is made
        self.sessions_opened = 0
        if connect_timeout is not None:
            self._client = AquaClient(
                socket_path, name=name, timeout=timeout, connect_timeout=connect_timeout
            )
            self.sessions_opened = 1

    @property
    def client(self) -> AquaClient | None:
        """The last client opened (whether or not its session is still up)."""
        return self._client

    def current(self) -> AquaClient | None:
        """The client while its session is up, else None (no round trip: `AquaClient.connected`)."""
        client = self._client
        return client if client is not None and client.connected() else None

    def ensure(self) -> AquaClient | None:
        """The live client; if there is none and an attempt is due, try once to open a session.

        Returns None at once while the backoff runs: a missing coordinator costs one failed
        `connect` per backoff period, not one per call.
        """
        client = self.current()
        if client is not None:
            return client
        with self._lock:
            if self._client is not None:
                if self._client.connected():  # another thread just opened it
                    return self._client
                self._client.close()
                self._client = None
            now = time.monotonic()
            if now < self._next_try:
                return None
            try:
                client = AquaClient(self.socket_path, name=self.name, timeout=self.timeout, connect_timeout=0)
            except CoordinatorUnavailable as exc:
                delay = self._backoff.next_delay()
                self._next_try = now + delay
                log.debug("aqua: no coordinator session (%s); next attempt in %.2fs", exc, delay)
                return None
            self._client = client
            self._backoff.reset()
            self.sessions_opened += 1
            if self.sessions_opened > 1:
                log.info("aqua: new coordinator session %s at %s", client.session, self.socket_path)
            return client

    def close(self) -> None:
        """Close the session (the coordinator frees its allocations and withdraws its leases)."""
        with self._lock:
            if self._client is not None:
                self._client.close()
