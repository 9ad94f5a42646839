"""For the API-key limit's race tests: make the two contenders count live keys in lockstep."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest


def count_live_keys_in_lockstep(monkeypatch: pytest.MonkeyPatch, parties: int = 2) -> None:
    """Each caller of `accounts.services.live_api_keys` waits (up to 1 s) after counting for the
    other `parties - 1` to have counted too: without the user-row lock all of them see the same
    free slot."""
    from accounts import services

    all_counted = threading.Barrier(parties)
    count = services.live_api_keys

    def slow_count(owner: Any) -> int:
        live = count(owner)
        with contextlib.suppress(threading.BrokenBarrierError):
            all_counted.wait(timeout=1.0)
        return live

    monkeypatch.setattr(services, "live_api_keys", slow_count)
