"""A simulator profile job's probe is told the GPU it runs on, the one its cost-model preset is of:
the job's preset_gpu, else the model's engine_options.sim_gpu, else the kind of the GPU its running
deployment has on its host (as the host registered the device). A probe of an engine that offloads
KV to a peer's lent memory needs it: that memory is reached over this GPU's own NVLink."""

from __future__ import annotations

from typing import Any

import pytest
from planning.profiling import simulator_probe, workload_of

from serving.costmodel.transfer import NVLINK3, NVLINK4, Link
from serving.profiler import SimulatorProbe
from serving.sim.config import EngineConfig
from tests.planning.helpers import deploy, make_host, make_model

WORKLOAD = {"num_requests": 50, "burst_duration_s": 1.0}
PEER = EngineConfig(preemption_mode="offload_peer", peer_capacity_bytes=1 << 30)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("params", "options", "gpu", "link"),
    [
        ({}, {}, "a100", NVLINK3),  # the deployed device: an A100
        ({}, {"sim_gpu": "h200"}, "h200", NVLINK4),
        ({"preset_gpu": "h100"}, {"sim_gpu": "h200"}, "h100", NVLINK4),
    ],
)
def test_the_simulator_probe_runs_on_the_gpu_its_preset_is_of(
    params: dict[str, Any], options: dict[str, Any], gpu: str, link: Link
) -> None:
    model = make_model("llama-3-8b", **options)
    deploy(model, make_host("host-a", gpus=1, gpu_name="NVIDIA A100-SXM4-80GB"), 0)
    params = {"model": model.name, "workload": WORKLOAD, **params}
    probe = simulator_probe(model, params, workload_of(model, params))
    assert isinstance(probe, SimulatorProbe) and probe.gpu == gpu
    store = probe.store(PEER)
    assert store is not None and store.peer_link == link
