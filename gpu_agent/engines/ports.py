"""`PortAllocator`: the TCP ports of this host's engines.

The kernel names a port that is free now (bind to port 0), but an engine binds it only seconds
later, once Python and vLLM have imported. Until then the port is free to the kernel, which may
name it again for the next engine. vLLM binds with SO_REUSEPORT, so both engines would then listen
on it, and the kernel would spread one deployment's requests over two different models. The
allocator therefore holds each port it hands out until the engine's whole process group is gone,
and does not hand it out again meanwhile.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

PICK_ATTEMPTS = 100


def free_port(host: str = "0.0.0.0") -> int:
    """A TCP port that no socket is bound to now, on any local IPv4 address (the engine may bind
    the host's outward address, not only loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class PortAllocator:
    """Ports free on the host and not held by another engine of this agent."""

    def __init__(self, pick: Callable[[], int] = free_port) -> None:
        """
        Args:
            pick: A port free on the host now; default: the kernel's choice.
        """
        self._pick = pick
        self.held: set[int] = set()

    def acquire(self) -> int:
        """A port for a new engine, held until `release()`; RuntimeError if none is found."""
        for _ in range(PICK_ATTEMPTS):
            port = self._pick()
            if port not in self.held:
                self.held.add(port)
                return port
        raise RuntimeError(f"no free TCP port outside the {len(self.held)} held by engines")

    def release(self, port: int) -> None:
        """Give `port` back (its engine's processes are gone)."""
        self.held.discard(port)
