"""`make run`'s settings (scripts/run_local.py): a bad PORT or CELERY_CONCURRENCY in the environment
is an argparse error naming the variable and its value (it used to be a ValueError traceback raised
while the parser was built, even for --help)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scripts.run_local import ROOT, RunConfig, parse_args


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("PORT", "abc", "environment variable PORT='abc' is not an integer"),
        ("PORT", "0", "environment variable PORT='0' is not a TCP port"),
        ("PORT", "65536", "environment variable PORT='65536' is not a TCP port"),
        ("CELERY_CONCURRENCY", "2.5", "environment variable CELERY_CONCURRENCY='2.5' is not an integer"),
        ("CELERY_CONCURRENCY", "0", "environment variable CELERY_CONCURRENCY='0' must be >= 1"),
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


def test_help_works_whatever_the_environment_holds() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run_local.py"), "--help"],
        env={"PATH": "", "PORT": "abc", "CELERY_CONCURRENCY": "2.5"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "Traceback" not in out.stderr and "--port" in out.stdout
