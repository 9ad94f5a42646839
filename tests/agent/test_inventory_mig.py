"""A GPU in MIG mode: CUDA runs on its MIG instances, not on the GPU, so an engine placed on it as
a whole (CUDA_VISIBLE_DEVICES=<index>) finds no device. The agent leaves it out, saying why."""

from __future__ import annotations

import logging

import pytest

from gpu_agent.inventory import NvmlInventory
from tests.agent.fake_nvml import FakeGpu, FakeNvml

GPU = 0


def test_it_leaves_out_a_gpu_in_mig_mode_with_a_warning_naming_it(caplog: pytest.LogCaptureFixture) -> None:
    gpus = [
        FakeGpu("00000000:17:00.0", mig=0, links=[("0000:2a:00.0", GPU), ("0000:3d:00.0", GPU)]),
        FakeGpu("00000000:2A:00.0", name="NVIDIA A100-SXM4-80GB", mig=1, links=[("0000:17:00.0", GPU)]),
        FakeGpu("00000000:3D:00.0", links=[("0000:17:00.0", GPU)]),  # no MIG support
    ]
    with caplog.at_level(logging.WARNING, logger="gpu_agent.inventory"):
        inv = NvmlInventory(FakeNvml(gpus))
    described = {d.index: (d.uuid, d.nvlink_peers) for d in inv.describe()}
    assert described == {0: ("GPU-00000000:17:00.0", [2]), 2: ("GPU-00000000:3D:00.0", [0])}
    assert [s.index for s in inv.sample()] == [0, 2]
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.levelno == logging.WARNING
    message = warning.getMessage()
    assert "GPU 1" in message and "GPU-00000000:2A:00.0" in message and "MIG" in message


def test_a_gpu_whose_mig_mode_cannot_be_read_is_used_as_before() -> None:
    gpu = FakeGpu("00000000:17:00.0", mig=1, errors={"nvmlDeviceGetMigMode": 999})  # UNKNOWN
    (device,) = NvmlInventory(FakeNvml([gpu])).describe()
    assert device.index == 0
