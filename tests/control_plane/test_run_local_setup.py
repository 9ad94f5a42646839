"""`make run`'s set-up commands (scripts/run_local.py): one that fails stops the run before anything
starts, with what it wrote and a line naming it (it was a CalledProcessError traceback, the
command's own error captured and never shown); one that succeeds has its notes relayed."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from scripts import run_local


def test_a_failed_set_up_command_is_named_with_its_error_and_nothing_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(run_local, "prepare", lambda env: None)  # local_agent fails before any query
    monkeypatch.setattr(run_local, "port_in_use", lambda config: False)  # whatever serves on 8000
    monkeypatch.setattr(run_local.Supervisor, "start", lambda self: pytest.fail("a process was started"))
    monkeypatch.setenv("VAR_DIR", str(tmp_path))
    monkeypatch.setenv("LOCAL_AGENT", "0")
    monkeypatch.setenv("SIMULATE", "Bad Kind")  # host "sim-1xbad kind": not a slug
    # parse_args refuses this SIMULATE up front (test_run_local_args); let it through to the set-up.
    monkeypatch.setattr(run_local, "parse_simulate_spec", lambda spec: (1, spec))
    assert run_local.main(["--port", "8000"]) == 1
    err = capsys.readouterr().err
    assert (
        "[run] set-up failed, nothing was started: "
        "`manage.py local_agent 'sim-1xbad kind' --simulated` exited with status 1"
    ) in err
    assert "[run] stderr of the failed command:\nCommandError: " in err and "slug" in err
    assert "Traceback" not in err


def test_a_set_up_commands_notes_are_relayed_and_its_output_returned(
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = "import sys; print('the-token'); print('tiny-llama is not deployed', file=sys.stderr)"
    out = run_local.setup_command([sys.executable, "-c", script], run_local.base_env(), capture=True)
    assert out == "the-token\n"
    assert capsys.readouterr().out == "[run] tiny-llama is not deployed\n"


def test_a_set_up_commands_progress_bar_and_blank_lines_are_no_notes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Each redrawing of the tiny model builder's progress bar was a [run] line, and so was a blank line.
    script = (
        "import sys; sys.stderr.write('\\n  \\nbuilding:  10%\\rbuilding:  50%\\rbuilding: 100%\\ndone\\n')"
    )
    run_local.setup_command([sys.executable, "-c", script], run_local.base_env(), capture=True)
    assert capsys.readouterr().out == "[run] building: 100%\n[run] done\n"


def test_a_port_in_use_stops_the_run_before_any_set_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second `make run` on a port a first one serves used to rotate the local agents' tokens
    (cutting off the first run's agents for good) and take the first run's health check for its
    own ("ready") before its web server failed to bind."""
    monkeypatch.setattr(run_local, "prepare", lambda env: pytest.fail("set-up ran"))
    monkeypatch.setattr(run_local, "agent_specs", lambda config, env: pytest.fail("agents were prepared"))
    monkeypatch.setenv("VAR_DIR", str(tmp_path))
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert run_local.main(["--host", "127.0.0.1", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"[run] http://127.0.0.1:{port} is in use" in err and "nothing was set up or started" in err
    assert not run_local.port_in_use(run_local.RunConfig("127.0.0.1", port, 1))  # free once closed
