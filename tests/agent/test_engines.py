"""Engine supervision against real subprocesses (tests/agent/fake_engine.py serves /health and
vLLM-style /metrics), plus the vLLM command line and the metrics arithmetic."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from gpu_agent.engines import EngineManager, LaunchSpec, VllmLauncher
from gpu_agent.engines.command import (
    AQUA_SCHEDULER,
    ENGINE_KEY_GUARD,
    OFFLOAD_STATS_FILE,
    REPO_ROOT,
    safe_name,
)
from gpu_agent.engines.logs import tail_lines
from gpu_agent.engines.metrics import Histogram, histogram_quantile, parse_metrics, summarize
from gpu_agent.protocol import DeploymentSpec, DeploymentStatus, EngineSample, ModelSpec
from serving.backoff import Backoff
from tests.agent.ws_server import wait_for

FAKE_ENGINE = str(Path(__file__).with_name("fake_engine.py"))


def spec(dep_id: str = "d1", devices: list[int] | None = None, **options: object) -> DeploymentSpec:
    return DeploymentSpec(
        dep_id, ModelSpec("tiny", "/models/tiny", engine_options=dict(options)), devices or [0]
    )


def fake_launcher(pidfile: Path) -> VllmLauncher:
    def launch(s: DeploymentSpec, port: int) -> LaunchSpec:
        extra = [str(a) for a in s.model.engine_options.get("fake_args", [])]
        env = {**os.environ, "FAKE_ENGINE_PIDFILE": str(pidfile)}
        stats = None
        if s.model.engine_options.get("stats"):
            env["AQUA_STATS_DIR"] = str(pidfile.parent / "stats" / s.id)
            stats = os.path.join(env["AQUA_STATS_DIR"], OFFLOAD_STATS_FILE)
        argv = [sys.executable, FAKE_ENGINE, "--port", str(port), *extra]
        return LaunchSpec(argv, env, offload_stats=stats)

    return launch  # type: ignore[return-value]


def manager(
    tmp_path: Path, launcher: object, statuses: list[DeploymentStatus], scrape_interval_s: float = 0.2
) -> EngineManager:
    """An engine manager on device 0 reporting to `statuses`, with short backoff and grace."""
    return EngineManager(
        launcher,  # type: ignore[arg-type]
        str(tmp_path / "logs"),
        statuses.append,
        devices={0},
        backoff_factory=lambda dep: Backoff(base_s=0.1, cap_s=0.2, seed=1),
        health_timeout_s=20,
        grace_s=2,
        scrape_interval_s=scrape_interval_s,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


class Env:
    def __init__(self, tmp: Path, grace_s: float = 2.0) -> None:
        self.pidfile = tmp / "pids"
        self.statuses: list[DeploymentStatus] = []
        self.manager = EngineManager(
            fake_launcher(self.pidfile),
            str(tmp / "logs"),
            self.statuses.append,
            devices={0, 1},
            backoff_factory=lambda dep: Backoff(base_s=0.3, cap_s=0.6, seed=1),
            health_timeout_s=20,
            grace_s=grace_s,
            scrape_interval_s=0.2,
        )

    def pids(self) -> list[int]:
        if not self.pidfile.exists():
            return []
        return [int(x) for x in self.pidfile.read_text().split()]

    def states(self, dep: str = "d1") -> list[str]:
        return [s.state for s in self.statuses if s.deployment_id == dep]


async def take_until(env: Env, done: Callable[[EngineSample], bool]) -> EngineSample:
    """Takes the first deployment's sample, as telemetry does each tick, until one is `done`."""
    taken: list[EngineSample] = []

    def took() -> bool:
        taken.append(env.manager.take_samples()[0])
        return done(taken[-1])

    await wait_for(took)
    return taken[-1]


@pytest_asyncio.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    e = Env(tmp_path)
    yield e
    await e.manager.close()


# ---- supervision against real processes --------------------------------------------------------


@pytest.mark.asyncio
async def test_it_starts_an_engine_waits_for_health_and_scrapes_metrics(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpu_agent.engines")
    await env.manager.apply([spec()])
    await wait_for(lambda: env.states()[-1:] == ["running"])
    assert env.states() == ["starting", "running"]
    assert env.statuses[-1].port is not None and env.statuses[-1].restarts == 0
    # The operator's terminal says where the engine answers, not only that it started.
    log_path = env.manager._engines["d1"].log_path
    url = f"http://127.0.0.1:{env.statuses[-1].port}"
    running = [r.getMessage() for r in caplog.records if "running at" in r.getMessage()]
    assert running == [f"Deployment d1 running at {url} (engine log {log_path})."]
    s = await take_until(env, lambda s: s.preemptions_total >= 2 and s.ttft is not None and s.ttft.count > 0)
    # A take holds the scrape windows since the previous take. Each of the fake's holds TTFTs 0.05,
    # 0.05, 0.3 and ITLs 0.02 x 10, so any number of them has the quantiles of one.
    assert s.ttft is not None and s.ttft.count % 3 == 0
    assert s.ttft.p50 == pytest.approx(0.0775) and s.ttft.p99 == pytest.approx(0.1 + 0.4 * 0.97)
    assert s.itl is not None and s.itl.count == s.ttft.count // 3 * 10 and 0.01 < (s.itl.p50 or 0) <= 0.025
    assert (s.kv_cache_usage, s.running, s.waiting, s.state) == (0.25, 3, 2, "running")


@pytest.mark.asyncio
async def test_it_reads_bytes_offloaded_from_the_aqua_connector_counters(env: Env) -> None:
    stale = env.pidfile.parent / "stats" / "d1" / OFFLOAD_STATS_FILE
    stale.parent.mkdir(parents=True)
    stale.write_text('{"bytes_offloaded": 999999999}')  # a previous process's counters
    await env.manager.apply([spec(stats=True)])
    offloaded = (await take_until(env, lambda s: s.bytes_offloaded > 0)).bytes_offloaded
    assert offloaded % 4096 == 0 and offloaded < 999999999


@pytest.mark.asyncio
async def test_it_restarts_an_engine_that_dies_and_counts_it(env: Env) -> None:
    await env.manager.apply([spec()])
    await wait_for(lambda: env.states()[-1:] == ["running"])
    (first,) = env.pids()
    os.kill(first, signal.SIGKILL)
    await wait_for(lambda: env.states().count("running") == 2)
    assert env.states() == ["starting", "running", "failed", "starting", "running"]
    failed = next(s for s in env.statuses if s.state == "failed")
    assert failed.error is not None and "exited with code -9" in failed.error
    assert env.statuses[-1].restarts == 1
    second = env.pids()[-1]
    assert second != first and alive(second)


@pytest.mark.asyncio
async def test_it_reports_the_engines_error_when_it_cannot_start_and_backs_off(env: Env) -> None:
    await env.manager.apply([spec(fake_args=["--fail-at-start", "model /models/tiny not found"])])
    await wait_for(lambda: "failed" in env.states())
    failed = next(s for s in env.statuses if s.state == "failed")
    assert failed.error is not None
    assert "while starting" in failed.error and "ValueError: model /models/tiny not found" in failed.error
    t0 = time.monotonic()
    await wait_for(lambda: env.states().count("failed") >= 3, timeout=10)
    # Backoff delays are >= 0.15, 0.3, 0.3 s (base 0.3 s, cap 0.6 s, equal jitter): no hot loop.
    assert time.monotonic() - t0 >= 0.3
    assert len(env.pids()) <= 4
    assert env.manager.statuses()[0].restarts >= 2


@pytest.mark.asyncio
async def test_it_stops_the_engine_when_the_deployment_goes(env: Env) -> None:
    await env.manager.apply([spec("d1"), spec("d2", [1])])
    await wait_for(lambda: env.states("d1")[-1:] == ["running"] and env.states("d2")[-1:] == ["running"])
    sup1, sup2 = env.manager.supervisor("d1"), env.manager.supervisor("d2")
    assert sup1 is not None and sup2 is not None
    pid1, pid2 = sup1.pid, sup2.pid
    assert pid1 is not None and pid2 is not None and sorted(env.pids()) == sorted([pid1, pid2])
    await env.manager.apply([spec("d2", [1])])
    assert env.states("d1")[-1] == "stopped"
    assert not alive(pid1) and alive(pid2)
    assert [s.deployment_id for s in env.manager.take_samples()] == ["d2"]


@pytest.mark.asyncio
async def test_it_kills_an_engine_that_ignores_sigterm_after_the_grace_period(tmp_path: Path) -> None:
    e = Env(tmp_path, grace_s=0.5)
    await e.manager.apply([spec(fake_args=["--ignore-sigterm"])])
    await wait_for(lambda: e.states()[-1:] == ["running"])
    (pid,) = e.pids()
    t0 = time.monotonic()
    await e.manager.apply([])
    assert time.monotonic() - t0 >= 0.5
    assert not alive(pid)
    assert "ignoring SIGTERM" in "\n".join(tail_lines(e.manager.log_path("d1"), 5))


@pytest.mark.asyncio
async def test_it_restarts_on_command_without_reporting_a_failure(env: Env) -> None:
    await env.manager.apply([spec()])
    await wait_for(lambda: env.states()[-1:] == ["running"])
    assert await env.manager.restart("d1") is True
    await wait_for(lambda: env.states().count("running") == 2)
    assert "failed" not in env.states()
    assert env.manager.statuses()[0].restarts == 1 and len(env.pids()) == 2
    assert await env.manager.restart("nope") is False


@pytest.mark.asyncio
async def test_it_refuses_devices_the_host_does_not_have(env: Env) -> None:
    await env.manager.apply([spec("d1", [0, 7])])
    assert env.states() == ["failed"]
    assert env.statuses[0].error is not None and "[7]" in env.statuses[0].error
    assert env.pids() == [] and env.manager.take_samples()[0].state == "failed"
    await env.manager.apply([])
    assert env.manager.statuses() == []


@pytest.mark.asyncio
async def test_a_deployment_refused_for_devices_the_host_does_not_have_is_reported_stopped_once_it_goes(
    env: Env,
) -> None:
    await env.manager.apply([spec("d1", [7]), spec("d2", [8])])
    assert env.states("d1") == ["failed"] and env.states("d2") == ["failed"]
    await env.manager.apply([spec("d2", [8])])  # the operator stops d1
    # Its last status stayed `failed` (one the control plane got after the stop stood): it was
    # dropped without a word.
    assert env.states("d1") == ["failed", "stopped"] and env.states("d2") == ["failed", "failed"]
    await env.manager.close()  # the agent stops: so is d2
    assert env.states("d1") == ["failed", "stopped"] and env.states("d2") == ["failed", "failed", "stopped"]
    assert env.manager.statuses() == [] and env.pids() == []


@pytest.mark.asyncio
async def test_it_replaces_an_engine_whose_spec_changed(env: Env) -> None:
    await env.manager.apply([spec(seed=1)])
    await wait_for(lambda: env.states()[-1:] == ["running"])
    await env.manager.apply([spec(seed=2)])
    await wait_for(lambda: env.states()[-1:] == ["running"])
    assert env.states() == ["starting", "running", "stopped", "starting", "running"]
    assert env.manager.deployments()["d1"].model.engine_options == {"seed": 2}


@pytest.mark.asyncio
async def test_it_keeps_a_log_file_per_engine_with_a_tail(env: Env) -> None:
    await env.manager.apply([spec()])
    await wait_for(lambda: env.states()[-1:] == ["running"])
    lines = env.manager.tail("d1", 2)
    assert lines is not None and lines[-1] == "fake engine ready"
    assert env.manager.log_path("d1").endswith(os.path.join("logs", "d1.log"))
    assert env.manager.tail("unknown", 5) is None


def test_deployment_ids_that_clean_to_one_file_name_get_different_files() -> None:
    ids = ["a_b", "a/b", "a\\b", "a b", ".a_b", "..", ".", "", "/", "Ω_b", "a\udcffb"]
    names = [safe_name(i) for i in ids]
    assert len(set(names)) == len(ids), names  # "a/b" and "a_b" shared a log and a stats folder
    assert safe_name("a_b") == "a_b" and safe_name("Ω_b") == "Ω_b"  # a clean id is kept as it is
    for name in names:
        assert name and not name.startswith(".") and "/" not in name and "\\" not in name, name


# ---- command line, metrics, logs ---------------------------------------------------------------


def test_it_builds_the_vllm_command_for_a_gpu_host_with_aqua() -> None:
    s = DeploymentSpec(
        "dep-1",
        ModelSpec(
            "llama",
            "meta/llama",
            "bfloat16",
            2,
            4096,
            {"aqua": True, "extra_args": ["--x", 1], "aqua_options": {"lent_bytes": 1 << 20}},
        ),
        [2, 3],
    )
    launcher = VllmLauncher(
        "gpu", aqua_socket="/run/aqua.sock", stats_dir="/var/st", base_env={"PYTHONPATH": "/x"}
    )
    launch = launcher(s, 8123)
    argv = launch.argv
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == "meta/llama"
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--max-model-len") + 1] == "4096"
    assert argv[argv.index("--scheduler-cls") + 1] == AQUA_SCHEDULER
    assert "--no-async-scheduling" in argv  # the connector's verified mode, not vLLM's GPU default
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv == {
        "kv_connector": "AquaConnector",
        "kv_connector_module_path": "serving.vllm_ext.connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "coordinator": "/run/aqua.sock",
            "consumer_id": "dep-1",
            "lent_bytes": 1 << 20,
        },
    }
    assert argv[-2:] == ["--x", "1"]
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert launch.env["PYTHONPATH"] == f"{REPO_ROOT}{os.pathsep}/x"
    assert launch.env["AQUA_COORDINATOR_SOCKET"] == "/run/aqua.sock"
    assert (launch.env["AQUA_ENGINE_ID"], launch.env["AQUA_DEVICE"]) == ("dep-1", "2")
    assert launch.env["AQUA_STATS_DIR"] == "/var/st/dep-1"
    assert launch.offload_stats == "/var/st/dep-1/offload-worker.json"
    assert "VLLM_CPU_KVCACHE_SPACE" not in launch.env


def test_a_cpu_engine_with_aqua_keeps_vllms_core_reservation_without_a_connector() -> None:
    launch = VllmLauncher("cpu", base_env={})(spec(aqua=True), 9000)
    assert "--kv-transfer-config" in launch.argv
    assert launch.env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"  # one per worker, none extra
    chosen = VllmLauncher("cpu", base_env={"VLLM_CPU_NUM_OF_RESERVED_CPU": "3"})(spec(aqua=True), 9000)
    assert chosen.env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "3"  # the operator's value is kept
    plain = VllmLauncher("cpu", base_env={})(spec(), 9000)
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in plain.env  # vLLM's own default applies
    gpu = VllmLauncher("gpu", base_env={})(spec(aqua=True), 9000)
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in gpu.env


def test_it_builds_the_vllm_command_for_a_cpu_host_without_aqua() -> None:
    s = spec(cpu_kvcache_space_gib=2, max_num_seqs=4)
    launch = VllmLauncher("cpu", base_env={})(s, 9000)
    assert "--scheduler-cls" not in launch.argv and "--kv-transfer-config" not in launch.argv
    assert "--no-async-scheduling" not in launch.argv  # vLLM's default without our plug-ins
    assert launch.argv[launch.argv.index("--max-num-seqs") + 1] == "4"
    assert launch.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    # A byte size must not be overridden by vLLM's legacy whole-GiB variable (inherited or ours).
    sized = VllmLauncher("cpu", base_env={"VLLM_CPU_KVCACHE_SPACE": "4"})(spec(kv_cache_bytes=1 << 20), 9000)
    assert sized.argv[sized.argv.index("--kv-cache-memory-bytes") + 1] == str(1 << 20)
    assert "VLLM_CPU_KVCACHE_SPACE" not in sized.env
    assert "CUDA_VISIBLE_DEVICES" not in launch.env
    assert launch.env["PYTHONPATH"] == REPO_ROOT
    assert launch.argv[launch.argv.index("--host") + 1] == "127.0.0.1" and launch.probe_host == "127.0.0.1"
    everywhere = VllmLauncher("cpu", bind="0.0.0.0", base_env={})(s, 9000)
    assert everywhere.argv[everywhere.argv.index("--host") + 1] == "0.0.0.0"
    assert everywhere.probe_host == "127.0.0.1"
    assert VllmLauncher("cpu", bind="10.0.0.7", base_env={})(s, 9000).probe_host == "10.0.0.7"


def test_the_engine_gets_its_deployments_key_in_its_environment_not_its_command_line() -> None:
    """vLLM then refuses /v1 requests without the key (the gateway sends it); argv would show it to
    any user of the host in `ps`."""
    keyed = dataclasses.replace(spec(), api_key="k" * 64)
    launch = VllmLauncher("gpu", base_env={"VLLM_API_KEY": "the-agents-own"})(keyed, 9000)
    assert launch.env["VLLM_API_KEY"] == "k" * 64
    assert not any("k" * 64 in arg for arg in launch.argv) and "k" * 64 not in str(launch)
    assert "k" * 64 not in repr(keyed)
    # No key in the spec: none at all, not one the agent's environment happens to hold.
    assert "VLLM_API_KEY" not in VllmLauncher("gpu", base_env={"VLLM_API_KEY": "x"})(spec(), 9000).env
    # vLLM's own check guards /v1 only; the guard middleware covers /invocations and the rest.
    assert launch.argv[launch.argv.index("--middleware") + 1] == ENGINE_KEY_GUARD
    assert "--middleware" not in VllmLauncher("gpu", base_env={})(spec(), 9000).argv


def test_the_engine_does_not_inherit_the_agents_host_token() -> None:
    """The engine runs model code (a repository's, with --trust-remote-code): the agent's token in
    its environment would let that code connect to the control plane as this host's agent."""
    base = {"GPU_AGENT_TOKEN": "at_secret", "PATH": "/usr/bin"}
    launch = VllmLauncher("gpu", base_env=base)(spec(), 9000)
    assert "GPU_AGENT_TOKEN" not in launch.env and launch.env["PATH"] == "/usr/bin"
    assert base["GPU_AGENT_TOKEN"] == "at_secret"  # the agent's own environment is left alone


def test_it_interpolates_quantiles_inside_buckets_like_prometheus() -> None:
    h = Histogram(((0.1, 10.0), (0.2, 30.0), (float("inf"), 40.0)))
    assert histogram_quantile(0.25, h) == pytest.approx(0.1)  # rank 10: top of the first bucket
    assert histogram_quantile(0.5, h) == pytest.approx(0.15)  # rank 20: half-way through (0.1, 0.2]
    assert histogram_quantile(0.99, h) == pytest.approx(0.2)  # in +Inf: the highest finite bound
    assert histogram_quantile(0.1, h) == pytest.approx(0.04)  # first bucket starts at 0
    assert histogram_quantile(0.5, Histogram(((0.1, 0.0), (float("inf"), 0.0)))) is None


def test_it_summarizes_the_window_between_scrapes_and_survives_counter_resets() -> None:
    before = Histogram(((0.1, 10.0), (1.0, 10.0), (float("inf"), 10.0)))
    after = Histogram(((0.1, 10.0), (1.0, 14.0), (float("inf"), 14.0)))
    window = after.minus(before)
    assert window.count == 4
    summary = summarize(window)
    assert summary is not None and summary.count == 4 and 0.1 < (summary.p50 or 0) <= 1.0
    restarted = Histogram(((0.1, 1.0), (1.0, 1.0), (float("inf"), 1.0)))
    assert restarted.minus(after) == restarted
    assert summarize(before.minus(before)) == summarize(Histogram(((0.1, 0.0), (float("inf"), 0.0))))


def test_it_parses_vllm_metrics_summing_label_sets() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{model_name="a"} 2',
            'vllm:num_requests_running{model_name="b"} 3',
            "# TYPE vllm:num_preemptions_total counter",
            'vllm:num_preemptions_total{model_name="a"} 4',
            "# TYPE vllm:kv_offload_store_bytes_total counter",
            'vllm:kv_offload_store_bytes_total{model_name="a"} 4096',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            'vllm:kv_cache_usage_perc{model_name="a"} 0.5',
            'vllm:kv_cache_usage_perc{model_name="b"} 0.25',
            "",
        ]
    )
    m = parse_metrics(text)
    assert (m.running, m.waiting, m.preemptions_total, m.bytes_offloaded) == (5, 0, 4, 4096)
    assert m.kv_cache_usage == pytest.approx(0.375)
    assert m.histograms == {}


def test_it_tails_long_logs_from_the_end(tmp_path: Path) -> None:
    path = tmp_path / "x.log"
    path.write_text("".join(f"line {i}\n" for i in range(5000)))
    assert tail_lines(str(path), 3, block=64) == ["line 4997", "line 4998", "line 4999"]
    assert tail_lines(str(tmp_path / "missing.log"), 3) == []


@pytest.mark.asyncio
async def test_it_leaves_no_engine_behind_when_the_agent_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    stand_in = str(Path(__file__).with_name("agent_stand_in.py"))
    agent = await asyncio.create_subprocess_exec(
        sys.executable, stand_in, str(tmp_path / "logs"), str(pidfile),
        env={**os.environ, "PYTHONPATH": REPO_ROOT}, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert agent.stdout is not None
    line = await asyncio.wait_for(agent.stdout.readline(), 30)
    assert line.strip() == b"running"
    (engine,) = [int(x) for x in pidfile.read_text().split()]
    assert alive(engine)
    agent.kill()  # SIGKILL: the agent gets no chance to stop its engines
    await agent.wait()
    try:
        await wait_for(lambda: not alive(engine), timeout=10)
    finally:
        if alive(engine):
            os.kill(engine, signal.SIGKILL)  # do not leak it when the test fails
