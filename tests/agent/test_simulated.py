"""Simulated hosts: devices, chunked simulation equal to one run, lending, placed deployments."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from gpu_agent.engines.command import REPO_ROOT
from gpu_agent.protocol import DeploymentSpec, DeploymentStatus, ModelSpec
from gpu_agent.sim_engine import CountingPeerStore, SimEngine, WorkloadStream
from gpu_agent.simulated import LEND_FRACTION, SimulatedHost
from serving.costmodel.gpus import GPU_SPECS
from serving.costmodel.presets import get_preset
from serving.costmodel.transfer import NVLINK3, NVLINK4, Link
from serving.metrics.latency import percentile
from serving.policies import get_policy
from serving.sim import EngineConfig, EngineSim
from tests.agent.ws_server import ControlPlaneStub, wait_for


def started(spec: str, **kw: object) -> tuple[SimulatedHost, list[DeploymentStatus]]:
    statuses: list[DeploymentStatus] = []
    host = SimulatedHost(spec, **kw)  # type: ignore[arg-type]
    asyncio.run(host.start(statuses.append))
    return host, statuses


def test_it_describes_n_gpus_of_the_kind_all_linked() -> None:
    host, _ = started("8xH100")
    devices = host.describe()
    assert [d.index for d in devices] == list(range(8))
    assert {d.memory_total_bytes for d in devices} == {GPU_SPECS["h100"].memory_bytes}
    assert all(d.kind == "gpu" and "H100" in d.name for d in devices)
    assert all(d.nvlink_peers == [j for j in range(8) if j != d.index] for d in devices)
    assert len({d.uuid for d in devices}) == 8
    h200, _ = started("2xH200")
    assert h200.describe()[0].memory_total_bytes == GPU_SPECS["h200"].memory_bytes > 140e9


def test_it_rejects_an_unknown_model_preset() -> None:
    with pytest.raises(ValueError, match="unknown model 'gpt-9'"):
        SimulatedHost("2xH100", model="gpt-9")


def test_it_simulates_in_one_second_chunks_exactly_like_one_run() -> None:
    cost = get_preset("llama-3-8b", "h100")
    config = EngineConfig(num_kv_blocks=400, block_size=16)  # small: forces preemptions
    chunked = SimEngine("e", cost, config, WorkloadStream("poisson", 8.0, seed=3), gpu="h100")
    windows = [chunked.advance() for _ in range(20)]

    requests = WorkloadStream("poisson", 8.0, seed=3).take_until(20.0)
    whole = EngineSim(cost, config, get_policy("fcfs"))
    records = whole.run(requests, until=20.0)
    assert chunked.sim.stats.preemptions == whole.stats.preemptions > 0
    for k, window in enumerate(windows):
        firsts = [
            r.token_times[0] - r.arrival for r in records if r.token_times and k <= r.token_times[0] < k + 1
        ]
        assert window.ttft.count == len(firsts)
        if firsts:
            assert window.ttft.p50 == pytest.approx(percentile(firsts, 50))
            assert window.ttft.p99 == pytest.approx(percentile(firsts, 99))
        gaps = [
            b - a
            for r in records
            for a, b in zip(r.token_times, r.token_times[1:], strict=False)
            if k <= b < k + 1
        ]
        assert window.itl.count == len(gaps)


def test_it_pairs_producers_with_consumers_that_borrow_under_bursts() -> None:
    host, _ = started("2xH100", rate=6.0, seed=0)
    mem = GPU_SPECS["h100"].memory_bytes
    host.advance_to(45.0)  # the first burst runs from 25 s to 35 s
    devices, engines = host.sample_at(45.0)
    consumer, producer = devices
    assert (consumer.aqua_role, consumer.paired_with) == ("consumer", 1)
    assert (producer.aqua_role, producer.paired_with) == ("producer", 0)
    assert producer.lent_bytes == int(LEND_FRACTION * mem)
    assert producer.memory_used_bytes == int(0.5 * mem) + producer.lent_bytes
    assert consumer.memory_used_bytes + consumer.memory_free_bytes == mem
    by_id = {e.deployment_id: e for e in engines}
    assert by_id["sim:0"].preemptions_total > 0 and by_id["sim:0"].bytes_offloaded > 0
    assert by_id["sim:1"].preemptions_total == 0
    assert all(e.state == "running" for e in engines)


@pytest.mark.parametrize(("kind", "link"), [("2xA100", NVLINK3), ("2xH100", NVLINK4)])
def test_it_offloads_to_lent_memory_over_the_gpus_own_nvlink(kind: str, link: Link) -> None:
    host, _ = started(kind)
    consumer = host._builtin[0]  # device 0 borrows from device 1
    assert consumer.role == "consumer"
    store = consumer.engine.store
    assert isinstance(store, CountingPeerStore)
    assert store.peer_link == link  # an A100 pair is NVLink 3 (300 GB/s), not NVLink 4's 450


def test_a_sim_engine_rejects_an_unknown_gpu() -> None:
    cost = get_preset("llama-3-8b", "h100")
    config = EngineConfig(num_kv_blocks=400, block_size=16, preemption_mode="offload_peer")
    with pytest.raises(ValueError, match="unknown gpu 'A100'"):
        SimEngine("e", cost, config, WorkloadStream("poisson", 8.0, seed=3), gpu="A100")


def test_it_is_deterministic_for_a_seed() -> None:
    a, _ = started("4xA100", seed=5)
    b, _ = started("4xA100", seed=5)
    a.advance_to(12.0)
    b.advance_to(12.0)
    assert a.sample_at(12.0) == b.sample_at(12.0)


def test_it_runs_placed_deployments_in_place_of_builtin_engines() -> None:
    host, statuses = started("4xH100")
    host.advance_to(30.0)
    model = ModelSpec("llama-3-8b", "meta-llama/Meta-Llama-3-8B", engine_options={"sim_rate": 2.0})
    asyncio.run(host.apply([DeploymentSpec("dep-a", model, [1])]))
    assert [(s.deployment_id, s.state, s.simulated) for s in statuses] == [("dep-a", "running", True)]
    devices, engines = host.sample_at(33.0)
    ids = [e.deployment_id for e in engines]
    assert "dep-a" in ids and "sim:1" not in ids
    # It starts at the host's current second: 3 s of arrivals at 2/s, not 33 s of backlog.
    dep_a = next(e for e in engines if e.deployment_id == "dep-a")
    assert dep_a.running + dep_a.waiting <= 12
    # Device 0's producer is gone, so it no longer borrows; devices 2 and 3 still pair.
    assert [d.aqua_role for d in devices] == ["none", "none", "consumer", "producer"]

    asyncio.run(host.apply([DeploymentSpec("dep-b", model, [9])]))
    failed = statuses[-1]
    assert (failed.deployment_id, failed.state) == ("dep-b", "failed")
    assert failed.error is not None and "[9]" in failed.error
    assert ("dep-a", "stopped") in [(s.deployment_id, s.state) for s in statuses]
    devices, engines = host.sample_at(34.0)
    assert [d.aqua_role for d in devices] == ["consumer", "producer", "consumer", "producer"]
    assert {e.deployment_id: e.state for e in engines}["dep-b"] == "failed"

    # A rate past the agent's own bound (an older control plane let 1e9 through: the engine then
    # failed out of memory) is refused as the spec's error, before any engine is made.
    flood = ModelSpec("llama-3-8b", "m", engine_options={"sim_rate": 1e9})
    asyncio.run(host.apply([DeploymentSpec("dep-c", flood, [0])]))
    refused = statuses[-1]
    assert (refused.deployment_id, refused.state) == ("dep-c", "failed")
    assert (
        refused.error is not None
        and "sim_rate=1000000000.0 must be positive and at most 1000" in refused.error
    )


@pytest.mark.asyncio
async def test_it_registers_a_simulated_host_from_the_command_line(tmp_path: Path) -> None:
    server = ControlPlaneStub()
    await server.start()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpu_agent", "--simulate", "8xH100", "--control-plane", server.url,
        "--token", "good-token", "--name", "sim-a", "--state-dir", str(tmp_path), cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        await wait_for(lambda: len(server.of_type("telemetry")) >= 2, timeout=30)
    finally:
        proc.terminate()
        out, _ = await asyncio.wait_for(proc.communicate(), 20)
        await server.stop()
    assert proc.returncode == 0, out.decode()
    reg = server.of_type("register")[0]
    assert reg["simulated"] is True and len(reg["devices"]) == 8
    t = server.of_type("telemetry")[-1]
    assert t["simulated"] is True and len(t["engines"]) == 8
    assert [d["aqua_role"] for d in t["devices"]] == ["consumer", "producer"] * 4


def test_once_stopped_it_starts_no_deployment() -> None:
    # The agent stops its host on SIGTERM and goes on reading frames until its link closes.
    host, statuses = started("2xH100")
    model = ModelSpec("llama-3-8b", "meta-llama/Meta-Llama-3-8B")
    asyncio.run(host.apply([DeploymentSpec("dep-a", model, [0])]))
    asyncio.run(host.stop())
    asyncio.run(host.apply([DeploymentSpec("dep-a", model, [0]), DeploymentSpec("dep-b", model, [1])]))
    assert [(s.deployment_id, s.state) for s in statuses] == [("dep-a", "running"), ("dep-a", "stopped")]
    assert host.statuses() == [] and host.sample_at(5.0)[1] == []


@pytest.mark.parametrize("rate", [None, [2.0], {"r": 2}, True, "2"])
def test_a_sim_rate_that_is_no_number_fails_its_deployment_alone(rate: object) -> None:
    # None, a list or a mapping raised TypeError out of apply(): the deployments after it in the
    # desired list were never placed (True and "2" ran at 1 and 2 requests/s).
    host, statuses = started("2xH100")
    bad = ModelSpec("llama-3-8b", "m", engine_options={"sim_rate": rate})
    good = ModelSpec("llama-3-8b", "m", engine_options={"sim_rate": 2.0})
    asyncio.run(host.apply([DeploymentSpec("dep-a", bad, [0]), DeploymentSpec("dep-b", good, [1])]))
    assert [(s.deployment_id, s.state) for s in statuses] == [("dep-a", "failed"), ("dep-b", "running")]
    assert statuses[0].error is not None and "engine_options.sim_rate" in statuses[0].error


def test_a_refused_deployment_that_goes_is_reported_stopped() -> None:
    # It was dropped without a word (on removal and at the agent's stop), so the failed status the
    # control plane got stood after the stop, as EngineManager did before.
    host, statuses = started("4xH100")
    model = ModelSpec("llama-3-8b", "m", engine_options={"sim_rate": 2.0})
    asyncio.run(host.apply([DeploymentSpec("dep-a", model, [9]), DeploymentSpec("dep-b", model, [8])]))
    assert [(s.deployment_id, s.state) for s in statuses] == [("dep-a", "failed"), ("dep-b", "failed")]
    asyncio.run(host.apply([DeploymentSpec("dep-b", model, [8])]))
    assert ("dep-a", "stopped") in [(s.deployment_id, s.state) for s in statuses]
    asyncio.run(host.stop())
    assert [(s.deployment_id, s.state) for s in statuses][-1] == ("dep-b", "stopped")
    assert host.statuses() == []
