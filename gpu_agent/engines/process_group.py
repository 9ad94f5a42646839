"""Ending an engine's process group: its leader and every process it spawned.

An engine runs in its own session, so its process group id is the leader's pid. vLLM spawns
workers (tensor-parallel ranks, the engine core) into that group, and they may outlive the leader:
the leader dies of SIGKILL or the OOM killer, or exits on SIGTERM before a worker that is stuck in
CUDA does. A worker left behind holds its GPU memory, and the next engine on those devices fails
for lack of it. So the group is ended as a whole, also when the leader has already gone.

Zombies do not count as members: a container whose init does not reap orphans would otherwise keep
a group "alive" for ever. A leader that SIGKILL does not end within `KILL_WAIT_S` (stuck in the
kernel) is logged at ERROR and left: its run ends as failed, and the agent can still stop.
SIGTERM is followed by SIGCONT, so that a stopped member ends on SIGTERM too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time

log = logging.getLogger(__name__)

POLL_S = 0.05  # how often a group is checked while it ends
KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for the leader and the members to go


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """Whether a process that is not a zombie is in process group `pgid`."""
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: ask the kernel (zombies then count)
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:  # it exited meanwhile
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


async def _wait_gone(pgid: int, deadline: float) -> bool:
    while group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


async def end_group(leader: asyncio.subprocess.Process, grace_s: float, name: str) -> None:
    """SIGTERM the leader's group, SIGKILL it after `grace_s`; return once no member is left.

    Call it while `leader` is the asyncio handle of the group's leader, also after the leader
    exited: the members it left are ended the same way.
    """
    pgid = leader.pid
    if leader.returncode is not None and not group_alive(pgid):
        return
    signal_group(pgid, signal.SIGTERM)
    # A stopped member (SIGSTOP, a debugger's Ctrl-Z: an engine failed as hung may be one) does not
    # act on SIGTERM until it is continued; without this it was given the whole grace period and
    # then SIGKILLed, never a clean exit.
    signal_group(pgid, signal.SIGCONT)
    deadline = time.monotonic() + grace_s
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(grace_s):
            await leader.wait()
    if leader.returncode is not None and await _wait_gone(pgid, deadline):
        return
    log.warning("Engine %s ignored SIGTERM for %.0f s; killing its process group.", name, grace_s)
    signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    try:
        async with asyncio.timeout(KILL_WAIT_S):
            await leader.wait()
    except TimeoutError:
        # Stuck in the kernel (uninterruptible sleep: a hung GPU driver, a dead NFS mount): no
        # signal ends it. Waiting for ever would leave the deployment unreported and the agent
        # unable to stop.
        log.error(
            "Engine %s: process %d did not exit %g s after SIGKILL (stuck in the kernel?); leaving it.",
            name,
            pgid,
            KILL_WAIT_S,
        )
        return
    if not await _wait_gone(pgid, deadline):
        log.error("Engine %s: processes of group %d are left after SIGKILL.", name, pgid)
