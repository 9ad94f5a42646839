"""`make run`'s settings (scripts/run_local.py): a bad PORT or CELERY_CONCURRENCY in the environment
is an argparse error naming the variable and its value (it used to be a ValueError traceback raised
while the parser was built, even for --help)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpu_agent.config import AgentConfig
from scripts.run_local import ROOT, RunConfig, base_url, parse_args, simulate_kind


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("PORT", "abc", "environment variable PORT='abc' is not an integer"),
        ("PORT", "0", "environment variable PORT='0' is not a TCP port"),
        ("PORT", "65536", "environment variable PORT='65536' is not a TCP port"),
        ("CELERY_CONCURRENCY", "2.5", "environment variable CELERY_CONCURRENCY='2.5' is not an integer"),
        ("CELERY_CONCURRENCY", "0", "environment variable CELERY_CONCURRENCY='0' must be >= 1"),
        # Accepted: passed to Celery, whose prefork pool starts that many Django processes at once.
        ("CELERY_CONCURRENCY", "65", "environment variable CELERY_CONCURRENCY='65' must be at most 64"),
        # Accepted: daphne failed to bind once the database was migrated and the agents set up.
        ("HOST", "gpu 1", "environment variable HOST='gpu 1' contains whitespace"),
        ("HOST", "", "environment variable HOST='' is empty"),
        # 'Bad Kind' failed in local_agent ('sim-bad kind' is no slug) after the migrations; 99xH100
        # got a host row and token, then its agent refused it (exit 2) and the whole run stopped.
        ("SIMULATE", "Bad Kind", "environment variable SIMULATE='Bad Kind': --simulate 'Bad Kind' is not"),
        ("SIMULATE", "99xH100", "SIMULATE='99xH100': --simulate '99xH100': device count must be 1..16"),
    ],
)
def test_a_bad_environment_value_is_an_argparse_error_naming_it(
    variable: str,
    value: str,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as exit_:
        parse_args([])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_flags_override_the_environment_and_the_environment_the_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("HOST", "PORT", "CELERY_CONCURRENCY"):
        monkeypatch.delenv(name, raising=False)
    assert parse_args([]) == RunConfig(host="127.0.0.1", port=8000, worker_concurrency=2)
    monkeypatch.setenv("PORT", "9001")
    monkeypatch.setenv("CELERY_CONCURRENCY", "3")
    monkeypatch.setenv("HOST", "0.0.0.0")
    assert parse_args([]) == RunConfig(host="0.0.0.0", port=9001, worker_concurrency=3)
    monkeypatch.setenv("PORT", "abc")  # a flag that is given wins: the variable is not read
    assert parse_args(["--port", "9002", "--worker-concurrency", "1"]).port == 9002
    with pytest.raises(SystemExit):
        parse_args(["--port", "0"])
    assert parse_args(["--port", "9002", "--worker-concurrency", "64"]).worker_concurrency == 64
    with pytest.raises(SystemExit):
        parse_args(["--port", "9002", "--worker-concurrency", str(10**30)])


def test_help_works_whatever_the_environment_holds() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run_local.py"), "--help"],
        env={"PATH": "", "PORT": "abc", "CELERY_CONCURRENCY": "2.5"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "Traceback" not in out.stderr and "--port" in out.stdout


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ("127.0.0.1:8000", "argument --host: '127.0.0.1:8000' looks like HOST:PORT"),
        ("http://localhost", "argument --host: 'http://localhost' is a URL or path"),
        ("", "argument --host: '' is empty"),
    ],
)
def test_a_bad_host_flag_is_an_argparse_error_naming_it(
    host: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--host", host])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("host", "url"),
    [
        # Was http://::1:8000, which the agents refused (exit 2): the whole run stopped.
        ("::1", "http://[::1]:8000"),
        ("[::1]", "http://[::1]:8000"),
        ("::", "http://127.0.0.1:8000"),
        ("0.0.0.0", "http://127.0.0.1:8000"),
        ("gpu-1.example.com", "http://gpu-1.example.com:8000"),
    ],
)
def test_the_agents_are_given_a_control_plane_url_they_accept(host: str, url: str) -> None:
    config = parse_args(["--host", host, "--port", "8000"])
    assert base_url(config) == url
    AgentConfig(control_plane=url, token="t")  # raises ValueError on a URL the agent refuses


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        # "8 x H100" passed the check, then named the host "sim-8 x h100", which local_agent refused
        # after the migrations and the local agent's set-up had run.
        ("8 x h100", "8xH100"),
        (" 4xa100 ", "4xA100"),
        ("1", "8xH100"),
        ("on", "8xH100"),
        ("off", None),
        ("", None),
        (None, None),
    ],
)
def test_simulate_is_normalised_to_the_spec_that_names_its_host(value: str | None, kind: str | None) -> None:
    assert simulate_kind(value) == kind
