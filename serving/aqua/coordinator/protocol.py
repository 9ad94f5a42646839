"""Wire format between aqua-lib clients and the coordinator server: JSON lines over a Unix socket.

Each frame is one JSON object on one line (UTF-8, '\n'-terminated, at most `MAX_FRAME` bytes).

    request: {"id": 7, "op": "allocate", "args": {"consumer_id": "eng-a", "nbytes": 4096}}
    reply:   {"id": 7, "ok": true, "result": {...}}
             {"id": 7, "ok": false, "error": {"code": "NotOwner", "message": "..."}}

Replies carry the id of their request. Operations (`OPS`) mirror the `Coordinator` methods; the
server adds the caller's session itself, so a client cannot act as another session.
"""

from __future__ import annotations

import json
from typing import Any

from serving.aqua.coordinator.errors import ProtocolError

MAX_FRAME = 1 << 20

# op -> argument names it accepts (the server rejects any other)
OPS: dict[str, frozenset[str]] = {
    "hello": frozenset({"name", "pid"}),
    "ping": frozenset(),
    "lease": frozenset({"producer_id", "device", "nbytes", "handle"}),
    "resize": frozenset({"region_id", "nbytes"}),
    "unlease": frozenset({"region_id"}),
    "request_reclaim": frozenset({"region_id"}),
    "reclaim_status": frozenset({"region_id"}),
    "allocate": frozenset({"consumer_id", "nbytes", "device_hint", "min_nbytes", "exclude_regions"}),
    "free": frozenset({"alloc_id", "consumer_id"}),
    "pending_reclaims": frozenset({"consumer_id"}),
    "allocation": frozenset({"alloc_id"}),
    "stats": frozenset(),
}


def encode(frame: dict[str, Any]) -> bytes:
    """One frame as a JSON line."""
    data = json.dumps(frame, separators=(",", ":")).encode() + b"\n"
    if len(data) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(data)} bytes exceeds the {MAX_FRAME}-byte limit")
    return data


def decode(line: bytes) -> dict[str, Any]:
    """Parse one JSON line into a frame dict; anything else raises ProtocolError."""
    try:
        frame = json.loads(line)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: deep nesting
        raise ProtocolError(f"undecodable frame: {type(exc).__name__}") from None
    if not isinstance(frame, dict):
        raise ProtocolError(f"a frame must be a JSON object, got {type(frame).__name__}")
    return frame
