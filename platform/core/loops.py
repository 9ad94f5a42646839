"""One object per asyncio event loop: per ASGI process in production, per test loop in tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    """``PerLoop(factory).get()``: the running loop's object, made by ``factory`` on first use.

    Objects of loops that have closed are dropped when a new one is made.
    """

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._by_loop: dict[asyncio.AbstractEventLoop, T] = {}

    def get(self) -> T:
        loop = asyncio.get_running_loop()
        found = self._by_loop.get(loop)
        if found is None:
            for closed in [lp for lp in self._by_loop if lp.is_closed()]:
                del self._by_loop[closed]
            found = self._by_loop[loop] = self._factory()
        return found

    def values(self) -> list[T]:
        return list(self._by_loop.values())
