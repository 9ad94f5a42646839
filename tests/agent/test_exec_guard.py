"""engines/exec_guard.py: an engine never outlives the agent that started it, also when the agent
dies in the moment between starting the guard and the guard's request for a parent-death signal."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpu_agent.engines.command import REPO_ROOT
from gpu_agent.engines.exec_guard import guarded

ENGINE = [sys.executable, "-c", "print('the engine ran', flush=True)"]


def run_agent(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` as the agent; what it and its orphans print, once the last of them has exited
    (reading the pipe to its end waits for every process that holds it)."""
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=env, cwd=REPO_ROOT
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_an_engine_whose_agent_died_before_the_guard_ran_is_not_started() -> None:
    # The agent starts an engine the way the supervisor does and dies at once: the guard, still
    # starting Python, has a new parent before it runs.
    died = run_agent(
        "import os, subprocess\n"
        "from gpu_agent.engines.exec_guard import guarded\n"
        f"subprocess.Popen(guarded({ENGINE!r}))\n"
        "os._exit(0)\n"
    )
    assert died.returncode == 0, died.stderr
    assert "the engine ran" not in died.stdout


def test_an_engine_whose_agent_lives_runs() -> None:
    lives = run_agent(
        "import subprocess\n"
        "from gpu_agent.engines.exec_guard import guarded\n"
        f"raise SystemExit(subprocess.run(guarded({ENGINE!r})).returncode)\n"
    )
    assert lives.returncode == 0, lives.stderr
    assert lives.stdout == "the engine ran\n"


def test_it_names_its_usage_when_the_parent_is_missing() -> None:
    bare = subprocess.run(guarded(ENGINE)[:2] + ENGINE, capture_output=True, text=True, timeout=30)
    assert bare.returncode == 1 and "--parent PID PROGRAM" in bare.stderr
