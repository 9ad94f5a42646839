"""The OpenMP core reservation handed to CPU engines that load the Aqua connector."""

from __future__ import annotations

import pytest

from serving.vllm_ext.cpu_binding import RESERVED_CPUS_ENV, reserved_cpus_env


def test_it_reserves_one_core_per_local_worker_like_vllm_without_a_connector() -> None:
    assert reserved_cpus_env() == {RESERVED_CPUS_ENV: "1"}
    assert reserved_cpus_env(2, {}) == {RESERVED_CPUS_ENV: "2"}


def test_it_keeps_an_operator_setting() -> None:
    assert reserved_cpus_env(1, {RESERVED_CPUS_ENV: "3"}) == {}
    assert reserved_cpus_env(1, {RESERVED_CPUS_ENV: ""}) == {RESERVED_CPUS_ENV: "1"}


def test_it_rejects_an_empty_engine() -> None:
    with pytest.raises(ValueError, match="local_world_size"):
        reserved_cpus_env(0)
