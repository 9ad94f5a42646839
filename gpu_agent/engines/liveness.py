"""`Liveness`: notices a running engine that stopped answering /health while its process lives on.

A hung engine (deadlocked, SIGSTOPped, its HTTP server wedged) never exits, so the supervisor's
exit watch alone kept it `running` and the gateway kept routing requests to it. While the engine
runs, /health is probed every `interval_s`; a probe fails on a timeout (`timeout_s`, a hard bound
on the whole request: a stopped process's kernel still accepts the connection, then nothing
answers), a connection error or a status other than 200. After `failures` consecutive failures
`watch()` returns the error to report; one success in between starts the count again, so that a
single slow answer (a busy event loop) does not fail an engine. A hung engine is noticed about
`failures * interval_s + timeout_s` seconds after it hung (probes are back to back when
`timeout_s` is the longer).

A /metrics scrape of the running engine (supervisor.py) is bounded by the same `timeout_s`, as a
whole and per read: vLLM serves it from the event loop that answers /health, so the time the
operator lets a busy engine take for a probe is the time it may take for a scrape. A separate,
shorter bound (one derived from the 1 s scrape interval, say) would only fail the scrapes of busy
engines; scrapes follow one another, so a longer one cannot pile them up, and one that fails only
leaves the last figures standing: the next scrape's latency window covers what it missed.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx


@dataclass
class FailureCount:
    """Consecutive failed probes: `failed()` until the limit, `passed()` starts again from 0."""

    limit: int
    count: int = 0
    first_at: float = 0.0  # monotonic start of the first probe of the current run of failures
    last: str = ""  # the latest failure, as reported

    def passed(self) -> None:
        self.count = 0

    def failed(self, started_at: float, error: str) -> bool:
        """Count a failed probe that started at `started_at`; True once `limit` failed in a row."""
        if self.count == 0:
            self.first_at = started_at
        self.count += 1
        self.last = error
        return self.count >= self.limit

    def error(self, now: float) -> str:
        checks = "1 check" if self.count == 1 else f"{self.count} checks"
        return (
            f"engine stopped answering /health: {checks} failed over {now - self.first_at:.1f} s;"
            f" last: {self.last}"
        )


@dataclass
class Liveness:
    """Probes a running engine's /health; `watch()` returns once it is judged hung."""

    interval_s: float = 10.0
    timeout_s: float = 5.0
    failures: int = 3

    def __post_init__(self) -> None:
        if not self.interval_s > 0 or not self.timeout_s > 0:  # also refuses nan
            raise ValueError(f"{self.interval_s=} and {self.timeout_s=} must be positive")
        if self.failures < 1:
            raise ValueError(f"{self.failures=} must be at least 1")

    async def watch(self, http: httpx.AsyncClient) -> str:
        """Probe every `interval_s` (from one probe's start to the next's) until `failures`
        probes in a row failed; returns the error that says so. Runs until cancelled otherwise."""
        count = FailureCount(self.failures)
        next_at = time.monotonic() + self.interval_s
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            started = time.monotonic()
            next_at = started + self.interval_s
            error = await self.probe(http)
            if error is None:
                count.passed()
            elif count.failed(started, error):
                return count.error(time.monotonic())

    async def probe(self, http: httpx.AsyncClient) -> str | None:
        """One /health request: None if it answered 200, else why not."""
        try:
            async with asyncio.timeout(self.timeout_s):  # httpx's timeouts are per phase
                resp = await http.get("/health", timeout=self.timeout_s)
        except (TimeoutError, httpx.TimeoutException):
            return f"no answer within {self.timeout_s:g} s"
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if resp.status_code != 200:
            return f"HTTP {resp.status_code}"
        return None
