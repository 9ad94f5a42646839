"""The command line and environment of one deployment's vLLM OpenAI server."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

from gpu_agent.engines.owned_flags import owned_flags_in
from gpu_agent.protocol import DeploymentSpec
from serving.vllm_ext.cpu_binding import reserved_cpus_env

AQUA_SCHEDULER = "serving.vllm_ext.scheduler.AquaScheduler"
ENGINE_KEY_GUARD = "serving.vllm_ext.engine_auth.EngineKeyGuard"
AQUA_KV_TRANSFER = {
    "kv_connector": "AquaConnector",
    "kv_connector_module_path": "serving.vllm_ext.connector",
    "kv_role": "kv_both",
}
# Written by serving.vllm_ext's offload worker into $AQUA_STATS_DIR (serving/aqua/offload/stats.py).
OFFLOAD_STATS_FILE = "offload-worker.json"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class EngineConfigError(ValueError):
    """A deployment's spec cannot become an engine command (e.g. `engine_options["seed"]` is
    "abc"). Launching it again cannot help: the supervisor reports it and waits for a new spec."""


def _opt(opts: dict[str, Any], key: str, kind: type[int] | type[float], default: Any = None) -> Any:
    """`engine_options[key]` as `kind`; EngineConfigError naming the option if it is not one.

    Strict like the control plane's check (platform/registry/validators.py): "4" is refused, as
    are booleans, NaN and infinities; 4.0 passes as an integer.
    """
    value = opts.get(key, default)
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok and kind is int:
        ok = value == int(value)
    if not ok:
        what = "an integer" if kind is int else "a number"
        raise EngineConfigError(f"engine_options[{key!r}] must be {what}, got {value!r:.200}")
    return kind(value)


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What to exec: argv and the complete environment."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    probe_host: str = "127.0.0.1"  # where the agent reaches the engine's /health and /metrics
    # The Aqua connector's worker counters (JSON with "bytes_offloaded"), if the engine writes one.
    offload_stats: str | None = None

    def base_url(self, port: int) -> str:
        """The engine's URL on `port`, as the agent reaches it (an IPv6 address in brackets)."""
        host = f"[{self.probe_host}]" if ":" in self.probe_host else self.probe_host
        return f"http://{host}:{port}"

    def __str__(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True, slots=True)
class VllmLauncher:
    """Builds `python -m vllm.entrypoints.openai.api_server ...` for a deployment.

    Attributes:
        host_kind: "gpu" (devices -> CUDA_VISIBLE_DEVICES) or "cpu" (vLLM's CPU build).
        bind: Address the engine listens on (the gateway must reach it).
        python: Interpreter with vLLM installed.
        aqua_socket: The host coordinator's socket, passed as AQUA_COORDINATOR_SOCKET.
        stats_dir: Parent of per-deployment Aqua counters directories (AQUA_STATS_DIR).
        base_env: Environment to start from (default: the agent's own).
    """

    host_kind: Literal["gpu", "cpu"]
    bind: str = "127.0.0.1"
    python: str = sys.executable
    aqua_socket: str | None = None
    stats_dir: str | None = None
    base_env: dict[str, str] | None = None

    def __call__(self, spec: DeploymentSpec, port: int) -> LaunchSpec:
        """The engine's command for `spec` on `port`; EngineConfigError if an option is invalid."""
        model = spec.model
        opts: dict[str, Any] = model.engine_options
        extra_args = opts.get("extra_args", [])
        if not isinstance(extra_args, list):
            raise EngineConfigError(f"engine_options['extra_args'] must be a list, got {extra_args!r:.200}")
        owned = owned_flags_in(extra_args)
        if owned:  # a model saved before the control plane refused them
            raise EngineConfigError(
                f"engine_options['extra_args'] may not give {', '.join(owned)}: the agent sets them"
            )
        argv = [self.python, "-m", "vllm.entrypoints.openai.api_server"]
        argv += ["--model", model.source, "--served-model-name", model.name]
        argv += ["--host", self.bind, "--port", str(port), "--dtype", model.dtype]
        argv += ["--tensor-parallel-size", str(model.tensor_parallel_size)]
        if model.max_context_len is not None:
            argv += ["--max-model-len", str(model.max_context_len)]
        if "seed" in opts:
            argv += ["--seed", str(_opt(opts, "seed", int))]
        if opts.get("enforce_eager"):
            argv.append("--enforce-eager")
        if "max_num_seqs" in opts:
            argv += ["--max-num-seqs", str(_opt(opts, "max_num_seqs", int))]
        if "kv_cache_bytes" in opts:
            argv += ["--kv-cache-memory-bytes", str(_opt(opts, "kv_cache_bytes", int))]
        if "gpu_memory_utilization" in opts and self.host_kind == "gpu":
            argv += ["--gpu-memory-utilization", str(_opt(opts, "gpu_memory_utilization", float))]
        if opts.get("aqua"):
            argv += ["--scheduler-cls", AQUA_SCHEDULER]
            argv += ["--kv-transfer-config", json.dumps(self._kv_transfer(spec))]
            # vLLM turns async scheduling on by default on GPUs. AquaScheduler subclasses the
            # synchronous Scheduler (vLLM: no overlap to gain then), and the connector is verified
            # only with it off: under it, failed loads and lost saves are reported a step late.
            argv.append("--no-async-scheduling")
        if spec.api_key:  # vLLM's own check leaves /invocations open (serving/vllm_ext/engine_auth.py)
            argv += ["--middleware", ENGINE_KEY_GUARD]
        argv += [str(a) for a in extra_args]  # last: they may override the options above

        env = dict(os.environ if self.base_env is None else self.base_env)
        # Our vLLM plug-ins (serving.vllm_ext) must import inside the engine's processes.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        # The deployment's key (the gateway sends it): in the environment, not argv, where any
        # user of the host would read it in `ps`. Without one, none the agent happens to have.
        env.pop("VLLM_API_KEY", None)
        # Nor the agent's own host token: the engine runs model code (a repository's, with
        # --trust-remote-code in extra_args), which could read it from the environment and
        # connect as this host's agent.
        env.pop("GPU_AGENT_TOKEN", None)
        if spec.api_key:
            env["VLLM_API_KEY"] = spec.api_key
        if self.host_kind == "gpu":
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA indices == NVML indices
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in spec.devices)
        else:
            # vLLM's CPU platform lets VLLM_CPU_KVCACHE_SPACE (whole GiB) override
            # --kv-cache-memory-bytes, so it is set only when no byte size was asked for; without
            # either, vLLM sizes the KV cache from a fraction of host RAM.
            if "kv_cache_bytes" in opts:
                env.pop("VLLM_CPU_KVCACHE_SPACE", None)
            else:
                env["VLLM_CPU_KVCACHE_SPACE"] = str(_opt(opts, "cpu_kvcache_space_gib", int, 1))
            if "cpu_threads" in opts:
                env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{_opt(opts, 'cpu_threads', int) - 1}"
            if opts.get("aqua"):
                # With any KV connector vLLM reserves an extra core per worker; on a small host that
                # leaves none, and the worker's threads share the busy-polling engine core's core
                # (serving/vllm_ext/cpu_binding.py): back to its no-connector reservation.
                env.update(reserved_cpus_env(model.tensor_parallel_size, env))
        if self.aqua_socket is not None:
            env["AQUA_COORDINATOR_SOCKET"] = self.aqua_socket
        env["AQUA_ENGINE_ID"] = spec.id
        env["AQUA_DEVICE"] = str(spec.devices[0])
        offload_stats = None
        if self.stats_dir is not None:
            env["AQUA_STATS_DIR"] = os.path.join(self.stats_dir, safe_name(spec.id))
            offload_stats = os.path.join(env["AQUA_STATS_DIR"], OFFLOAD_STATS_FILE)
        probe = "127.0.0.1" if self.bind in ("", "0.0.0.0", "::") else self.bind
        return LaunchSpec(argv, env, probe_host=probe, offload_stats=offload_stats)

    def _kv_transfer(self, spec: DeploymentSpec) -> dict[str, Any]:
        """The Aqua connector's config: the coordinator socket and this deployment's id as its
        consumer id (how the agent maps lending back to devices), plus engine_options["aqua_options"]
        (e.g. dram_bytes, lent_bytes; see serving/vllm_ext/offload_config.py)."""
        aqua_options = spec.model.engine_options.get("aqua_options", {})
        if not isinstance(aqua_options, dict):
            raise EngineConfigError(
                f"engine_options['aqua_options'] must be a mapping, got {aqua_options!r:.200}"
            )
        extra: dict[str, Any] = dict(aqua_options)
        if self.aqua_socket is not None:
            extra.setdefault("coordinator", self.aqua_socket)
        extra.setdefault("consumer_id", spec.id)
        return {**AQUA_KV_TRANSFER, "kv_connector_extra_config": extra}


def safe_name(deployment_id: str) -> str:
    """A deployment id as a file name: letters, digits, '-', '_', '.' kept; others become '_'.

    An id that had to be changed gets a hash of itself appended, so that two ids that clean to
    the same name ("a/b" and "a_b", ".x" and "x") do not share a log file or a stats folder.
    """
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in deployment_id)
    name = cleaned.lstrip(".")
    if name and name == deployment_id:
        return name
    digest = hashlib.sha256(deployment_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{name or '_'}-{digest}"
