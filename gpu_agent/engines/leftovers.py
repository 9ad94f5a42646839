"""Engine process groups a previous agent left running, found and ended when the agent starts.

The engine's exec guard (exec_guard.py) has the kernel send its leader SIGTERM when the agent dies,
but a leader that does not exit on it (stuck in CUDA, its shutdown hung) and the workers it spawned
outlive a killed agent (SIGKILL, the OOM killer, a crash; outside a systemd unit, nothing else ends
them). They hold their GPUs' memory, so every engine the restarted agent starts there fails. So a
supervisor records each engine's process group (`<log_dir>/<deployment>.<pgid>.group`: its pgid, its
leader's start time and its devices) while the group lives, and removes the record once it is gone. One
file a group: a group that outlived its SIGKILL keeps its record when the same deployment's next
engine starts (one file a deployment was overwritten by it, and no later agent tried to end the
group that survived). A record
found when the agent starts is a group the previous agent left: it is ended (SIGTERM, SIGKILL after
the grace period) before any engine starts, with a WARNING naming it. One that survives that (or
whose record cannot be read for now) is returned as a `Leftover`, its record kept: the engine
manager tries it again while the agent runs, and starts no engine on its recorded devices until it
is gone (engines/manager.py).

A recorded pgid is only signalled while it is still that group: while its leader is the process
that was recorded (same start time, so not a reused pid), or, once the leader is gone, while
members are left (the kernel does not reuse a pid that is still a process group's id).
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import signal
import time
from dataclasses import dataclass

from gpu_agent.engines.process_group import KILL_WAIT_S, POLL_S, group_alive, signal_group

log = logging.getLogger(__name__)

RECORD_SUFFIX = ".group"


@dataclass(frozen=True)
class Leftover:
    """A recorded engine group still there after an attempt to end it, or whose record could not
    be read (`pgid`, `deployment` and `devices` None)."""

    path: str  # its record
    pgid: int | None
    deployment: str | None
    devices: frozenset[int] | None  # None: unknown (not recorded by an older agent, or unread)
    port: int | None = None  # an engine run of this agent's: held (engines/ports.py) until it is gone


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat); None if it is gone
    or there is no procfs."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # from field 3 (state) on
    try:
        return int(fields[19])  # field 22: starttime
    except (IndexError, ValueError):
        return None


def record_path(stem: str, pgid: int) -> str:
    """Where engine group `pgid` of the deployment whose records start with `stem` is recorded:
    `<stem>.<pgid>.group`. No two groups alive at once share a pgid, so a record kept for a group
    that is still there is never overwritten."""
    return f"{stem}.{pgid}{RECORD_SUFFIX}"


def write_record(path: str, pgid: int, deployment_id: str, devices: list[int]) -> None:
    """Record the engine group `pgid` (whose leader was just started on `devices`) at `path`
    (`record_path`)."""
    record = {"pgid": pgid, "start": start_time(pgid), "deployment": deployment_id, "devices": devices}
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(record, f)
    except OSError as exc:  # the engine runs anyway; only a killed agent's leftovers go unseen
        log.warning("Could not record engine group %d at %s: %s", pgid, path, exc)


def remove_record(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _still_ours(pgid: int, start: object) -> bool:
    """Whether process group `pgid` is still the recorded engine group (see the module)."""
    if not group_alive(pgid):
        return False
    now = start_time(pgid)
    return now is None or now == start  # leader gone (members left), or the same leader


def records(log_dir: str) -> list[str]:
    """The engine group records in `log_dir`, sorted."""
    return sorted(glob.glob(os.path.join(glob.escape(log_dir), f"*{RECORD_SUFFIX}")))


def end_leftovers(log_dir: str, grace_s: float) -> int:
    """End every engine group recorded in `log_dir` that is still running; the number found
    running (`end_recorded`). Call it before engines start, off the loop."""
    return end_recorded(records(log_dir), grace_s)[0]


def end_recorded(paths: list[str], grace_s: float) -> tuple[int, list[Leftover]]:
    """End the engine groups recorded at `paths` that are still running: the number found running,
    and those left (kept with their records, for a later try). Blocks up to grace_s + KILL_WAIT_S
    a group: call it off the loop, and only on records of groups no supervisor of this agent owns."""
    found, left = 0, []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
        except FileNotFoundError:
            continue  # gone meanwhile
        except OSError as exc:  # (EIO, EMFILE: maybe passing) the group may be there: try again later
            log.error("Engine group record %s cannot be read (%s); it is tried again later.", path, exc)
            left.append(Leftover(path, None, None, None))
            continue
        try:
            pgid, start, name = int(record["pgid"]), record.get("start"), str(record.get("deployment"))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("Ignoring an unreadable engine group record %s: %s", path, exc)
            remove_record(path)
            continue
        devices = _devices(record.get("devices"))
        if pgid > 1 and _still_ours(pgid, start):
            log.warning(
                "Engine of deployment %s (process group %d, devices %s) was left running (by a previous"
                " agent, or by a run of this one that SIGKILL did not end); ending it.",
                name,
                pgid,
                "unknown" if devices is None else sorted(devices),
            )
            found += 1
            if not _end(pgid, grace_s):
                log.error("Engine group %d of deployment %s is left after SIGKILL.", pgid, name)
                left.append(Leftover(path, pgid, name, devices))
                continue  # kept: tried again later
        remove_record(path)
    return found, left


def _devices(value: object) -> frozenset[int] | None:
    """The recorded devices; None if not recorded (an older agent's record) or not a list of ints."""
    if isinstance(value, list) and all(type(d) is int for d in value):
        return frozenset(value)
    return None


def _end(pgid: int, grace_s: float) -> bool:
    """SIGTERM the group, SIGKILL it after `grace_s`; whether it is gone."""
    signal_group(pgid, signal.SIGTERM)
    signal_group(pgid, signal.SIGCONT)  # a stopped member acts on SIGTERM only once continued
    for sig, wait_s in ((None, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        if sig is not None:
            signal_group(pgid, sig)
        deadline = time.monotonic() + wait_s
        while group_alive(pgid):
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        else:
            return True
    return False
