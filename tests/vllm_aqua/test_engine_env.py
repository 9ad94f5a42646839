"""The environment the test engines are started with is set only while they start."""

from __future__ import annotations

import os

import pytest

from serving.vllm_ext.cpu_binding import RESERVED_CPUS_ENV
from tests.vllm_aqua import engines


def test_engine_settings_hold_during_the_start_and_are_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    monkeypatch.delenv(RESERVED_CPUS_ENV, raising=False)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    before = dict(os.environ)
    with engines.engine_env():
        assert os.environ["VLLM_LOGGING_LEVEL"] == "WARNING"
        assert os.environ[RESERVED_CPUS_ENV] == "1"
        assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(engines.REPO), "/elsewhere"]
    assert dict(os.environ) == before


def test_it_keeps_what_the_caller_set_and_restores_after_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    monkeypatch.setenv(RESERVED_CPUS_ENV, "2")
    before = dict(os.environ)
    with pytest.raises(RuntimeError), engines.engine_env():
        assert os.environ["VLLM_LOGGING_LEVEL"] == "DEBUG"
        assert os.environ[RESERVED_CPUS_ENV] == "2"
        raise RuntimeError("engine failed to start")
    assert dict(os.environ) == before
