"""engines/process_group.py: ending an engine whose leader no signal ends (stuck in the kernel, in
uninterruptible sleep, as processes of a hung GPU driver are)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import pytest

from gpu_agent.engines import process_group
from gpu_agent.engines.process_group import end_group

NO_SUCH_GROUP = 2**30  # above any pid_max (at most 2^22): signals to it reach nobody


class UnkillableLeader:
    """Stands in for the asyncio handle of a leader in uninterruptible sleep: it never exits,
    whatever it is sent (no real process can be put in that state for a test)."""

    pid = NO_SUCH_GROUP
    returncode: int | None = None

    async def wait(self) -> int:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@pytest.mark.asyncio
async def test_a_leader_that_survives_sigkill_is_given_up_on_with_an_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(process_group, "KILL_WAIT_S", 0.2)
    sent: list[signal.Signals] = []
    monkeypatch.setattr(process_group, "signal_group", lambda pgid, sig: sent.append(sig))
    with caplog.at_level(logging.ERROR, logger="gpu_agent.engines.process_group"):
        # Returns, so that its deployment is reported and the agent can stop.
        await asyncio.wait_for(end_group(UnkillableLeader(), 0.1, "d1"), 5)  # type: ignore[arg-type]
    assert sent == [signal.SIGTERM, signal.SIGCONT, signal.SIGKILL]
    assert f"Engine d1: process {NO_SUCH_GROUP} did not exit 0.2 s after SIGKILL" in caplog.text


@pytest.mark.asyncio
async def test_a_stopped_engine_ends_on_sigterm_within_the_grace_period() -> None:
    # Exits 0 on SIGTERM (as vLLM's server does), so that SIGKILL would show in its return code.
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0));"
        " print(1, flush=True); time.sleep(60)"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, start_new_session=True
    )
    try:
        assert proc.stdout is not None and await proc.stdout.readline() == b"1\n"  # handler set
        os.kill(proc.pid, signal.SIGSTOP)
        # Within far less than the grace period, with the engine's own clean exit.
        await asyncio.wait_for(end_group(proc, 30.0, "d1"), 10)
        assert proc.returncode == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
