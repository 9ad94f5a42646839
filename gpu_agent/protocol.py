"""The wire protocol between GPU agents and the control plane (one websocket per host, /ws/agent/).

Every message is one JSON object (a text frame) ``{"v": 1, "type": "<type>", ...fields}``; the
fields of each type are the dataclasses below. See gpu_agent/PROTOCOL.md for the prose version.

Agent -> control plane:
  register            once per connection, first: the host and its devices.
  heartbeat           every second.
  telemetry           every second: per-device and per-engine samples; buffered while disconnected.
  deployment_status   whenever a deployment's state changes, and for every deployment on (re)connect.
  log_tail            the last lines of a deployment's engine log, answering a `tail_log` command.
  probe_result        latency percentiles and KV use of one replayed workload, answering a `probe`.
Control plane -> agent:
  desired_deployments the full list of deployments this host must run (replaces the previous one).
  command             one action: restart a deployment, or send a log tail.
  probe               replay a workload against a deployment's engine at one rate (profiling).
Both directions:
  error               the peer sent something it could not accept; the link stays up.

Values are bounded where the control plane stores them: integers fit in 64 bits (gpu_agent/schema.py),
device indices in 0..MAX_DEVICE_INDEX, counts in 0..MAX_COUNT, times `ts` in [0, MAX_TS), no
string holds a NUL character (PostgreSQL refuses it), and `register`'s `address` is a host name or IP
address alone of at most MAX_ADDRESS_LENGTH characters (`host_address`). A value out of range is a
`ProtocolError` like any other, as is a message nested too deeply to decode, so the receiver answers
with an `error` frame instead of failing later in its database or its JSON decoder.

The profiling frames (`probe`, `probe_result`) are in gpu_agent/probe_frames.py, host addresses in
gpu_agent/address.py, the frame base and the field decoding in gpu_agent/schema.py; all are
re-exported here.

`parse_frame(dict)` returns the typed frame or raises `ProtocolError` naming the bad field;
`dumps`/`loads` do the JSON around it. This module imports nothing outside the standard library,
so the control plane can import it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from gpu_agent.address import MAX_ADDRESS_LENGTH, MAX_HOST_NAME, address_problem, host_address, quoted
from gpu_agent.probe_frames import IterationSample, Probe, ProbeReport, ProbeRequestSpec
from gpu_agent.schema import (
    INT64_MAX,
    MAX_COUNT,
    MAX_DEVICE_INDEX,
    MAX_TS,
    PROTOCOL_VERSION,
    Frame,
    ProtocolError,
    Sender,
    at_most,
    at_most_chars,
    check,
    decode,
    non_negative,
    timestamp,
    without_nul,
)

DeviceKind = Literal["gpu", "cpu"]
AquaRole = Literal["producer", "consumer", "none"]
DeploymentState = Literal["starting", "running", "failed", "stopped"]

# Close codes the control plane uses after accepting the socket (see PROTOCOL.md).
CLOSE_TOKEN_REFUSED = 4401  # the token is not, or no longer, a live token of the host
CLOSE_WRONG_HOST = 4403  # `register` named another host than the token's
CLOSE_SUPERSEDED = 4409  # a newer connection of the same host registered; this one is dropped
CLOSE_REGISTER_REFUSED = 4422  # `register` cannot be stored (a device another host registered)
CLOSE_TRY_AGAIN = 4503  # `register` cannot be stored now (the database went away or timed out)

# Lengths of the strings `register` carries, as the control plane's columns hold them
# (inventory.models.Host.name, Device.uuid/name, agents.models.AgentLink.agent_version;
# tests/fleet/test_register_lengths.py keeps them equal: this module cannot import Django).
MAX_HOST_NAME_LENGTH = 100
MAX_DEVICE_UUID_LENGTH = 64
MAX_DEVICE_NAME_LENGTH = 200
MAX_AGENT_VERSION_LENGTH = 64

# The longest heartbeat interval an agent may announce in `register` (seconds). The control plane
# waits that long times a few missed beats before it calls the host stale, so a longer one would let
# a dead host look alive for minutes; an agent refuses to start with more.
MAX_HEARTBEAT_INTERVAL_S = 60.0
# What the control plane assumes of an agent whose `register` carries no interval.
DEFAULT_HEARTBEAT_INTERVAL_S = 1.0

__all__ = [
    "CLOSE_REGISTER_REFUSED",
    "CLOSE_SUPERSEDED",
    "CLOSE_TOKEN_REFUSED",
    "CLOSE_TRY_AGAIN",
    "CLOSE_WRONG_HOST",
    "DEFAULT_HEARTBEAT_INTERVAL_S",
    "MAX_ADDRESS_LENGTH",
    "MAX_COUNT",
    "MAX_DEVICE_INDEX",
    "MAX_HEARTBEAT_INTERVAL_S",
    "MAX_HOST_NAME",
    "MAX_TS",
    "PROTOCOL_VERSION",
    "Command",
    "DeploymentSpec",
    "DeploymentStatus",
    "DesiredDeployments",
    "DeviceInfo",
    "DeviceSample",
    "EngineSample",
    "ErrorFrame",
    "Frame",
    "Heartbeat",
    "IterationSample",
    "LatencySummary",
    "LogTail",
    "ModelSpec",
    "Probe",
    "ProbeReport",
    "ProbeRequestSpec",
    "ProtocolError",
    "Register",
    "Telemetry",
    "decode_json",
    "dumps",
    "host_address",
    "loads",
    "parse_frame",
    "without_nul",
]


# ---- agent -> control plane -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """A device as registered. `index` is the host-local index deployments refer to."""

    index: int
    uuid: str
    name: str
    kind: DeviceKind
    memory_total_bytes: int
    nvlink_peers: list[int] = field(default_factory=list)  # indices of devices reachable by NVLink

    def __post_init__(self) -> None:
        at_most(self, MAX_DEVICE_INDEX, "index")
        non_negative(self, "memory_total_bytes")
        check(bool(self.uuid), "uuid", "must not be empty")
        at_most_chars(self, MAX_DEVICE_UUID_LENGTH, "uuid")
        at_most_chars(self, MAX_DEVICE_NAME_LENGTH, "name")
        peers_ok = all(0 <= p <= MAX_DEVICE_INDEX for p in self.nvlink_peers)
        check(peers_ok, "nvlink_peers", f"indices must be in 0..{MAX_DEVICE_INDEX}")


@dataclass(frozen=True, slots=True)
class Register(Frame):
    """First frame of every connection. `address` is where the gateway reaches this host's engines:
    a host name or IP address alone (`host_address`), or "" when not known. `heartbeat_interval_s`
    is how often this agent sends heartbeats (and telemetry); the control plane waits for a few
    missed beats of it before it calls the host stale. Optional: an agent that leaves it out is
    taken to beat every second."""

    TYPE: ClassVar[str] = "register"
    SENDERS: ClassVar[tuple[Sender, ...]] = ("agent",)
    host: str
    address: str
    agent_version: str
    simulated: bool
    devices: list[DeviceInfo]
    heartbeat_interval_s: float | None = None

    def __post_init__(self) -> None:
        check(bool(self.host), "host", "must not be empty")
        at_most_chars(self, MAX_HOST_NAME_LENGTH, "host")
        at_most_chars(self, MAX_AGENT_VERSION_LENGTH, "agent_version")
        # "" is allowed: the address is not known (the host's replicas get no URL until it is).
        why = address_problem(self.address, False) if self.address else ""
        check(
            not why,
            "address",
            f"must be a host name or IP address, with no port or scheme: {quoted(self.address)} {why}",
        )
        beat = self.heartbeat_interval_s
        ok = beat is None or 0 < beat <= MAX_HEARTBEAT_INTERVAL_S
        check(ok, "heartbeat_interval_s", f"must be in (0, {MAX_HEARTBEAT_INTERVAL_S:g}], got {beat!r}")
        indices = [d.index for d in self.devices]
        check(len(set(indices)) == len(indices), "devices", f"duplicate device index in {indices}")

    def to_dict(self) -> dict[str, Any]:
        # Without an interval the key is left out, not sent as null: control planes older than the
        # field refuse unknown fields, and an agent beating every second must still register there.
        out = Frame.to_dict(self)
        if self.heartbeat_interval_s is None:
            del out["heartbeat_interval_s"]
        return out


@dataclass(frozen=True, slots=True)
class Heartbeat(Frame):
    TYPE: ClassVar[str] = "heartbeat"
    SENDERS: ClassVar[tuple[Sender, ...]] = ("agent",)
    ts: float  # agent's wall clock, seconds since the epoch

    def __post_init__(self) -> None:
        timestamp(self.ts)


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Quantiles of one latency histogram over the sample's window (seconds).

    `count` is the number of observations in the window; p50/p99 are None when it is 0.
    """

    count: int
    p50: float | None = None
    p99: float | None = None

    def __post_init__(self) -> None:
        at_most(self, MAX_COUNT, "count")
        non_negative(self, "p50", "p99")


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """One device's state at the telemetry timestamp. None: the device cannot report it."""

    index: int
    memory_used_bytes: int
    memory_free_bytes: int
    utilization_pct: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    aqua_role: AquaRole = "none"
    lent_bytes: int = 0  # this device's memory lent to another device's engine (producer)
    borrowed_bytes: int = 0  # memory of another device used by this device's engine (consumer)
    paired_with: int | None = None  # index of the device on the other side of the lending

    def __post_init__(self) -> None:
        at_most(self, MAX_DEVICE_INDEX, "index", "paired_with")
        non_negative(self, "memory_used_bytes", "memory_free_bytes", "power_w")
        non_negative(self, "lent_bytes", "borrowed_bytes")
        u = self.utilization_pct
        if u is not None and not 0 <= u <= 100:
            raise ProtocolError("utilization_pct", f"must be in [0, 100], got {u!r}")


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One deployment's engine metrics over the last telemetry window."""

    deployment_id: str
    state: DeploymentState
    ttft: LatencySummary | None = None  # time to first token
    itl: LatencySummary | None = None  # inter-token latency (time between tokens)
    kv_cache_usage: float | None = None  # fraction in [0, 1]
    running: int = 0
    waiting: int = 0
    preemptions_total: int = 0  # since the engine process started
    bytes_offloaded: int = 0  # KV bytes moved out on preemption, since the engine started

    def __post_init__(self) -> None:
        at_most(self, MAX_COUNT, "running", "waiting")
        # Stored as signed 64-bit integers: an engine's /metrics can give any float (1e30 bytes).
        at_most(self, INT64_MAX, "preemptions_total", "bytes_offloaded")
        k = self.kv_cache_usage
        if k is not None and not 0 <= k <= 1:
            raise ProtocolError("kv_cache_usage", f"must be in [0, 1], got {k!r}")


@dataclass(frozen=True, slots=True)
class Telemetry(Frame):
    """Per-second sample. `dropped` counts telemetry frames this agent dropped since it started
    because its buffer was full while disconnected (cumulative)."""

    TYPE: ClassVar[str] = "telemetry"
    SENDERS: ClassVar[tuple[Sender, ...]] = ("agent",)
    ts: float
    devices: list[DeviceSample]
    engines: list[EngineSample] = field(default_factory=list)
    dropped: int = 0
    simulated: bool = False

    def __post_init__(self) -> None:
        timestamp(self.ts)
        non_negative(self, "dropped")


@dataclass(frozen=True, slots=True)
class DeploymentStatus(Frame):
    TYPE: ClassVar[str] = "deployment_status"
    SENDERS: ClassVar[tuple[Sender, ...]] = ("agent",)
    deployment_id: str
    state: DeploymentState
    ts: float
    error: str | None = None  # the engine's last log lines when it failed
    restarts: int = 0
    port: int | None = None  # the engine's OpenAI-compatible server port on the host's address
    simulated: bool = False

    def __post_init__(self) -> None:
        timestamp(self.ts)
        at_most(self, MAX_COUNT, "restarts")
        p = self.port
        check(p is None or 0 < p < 65536, "port", f"must be in 1..65535, got {p!r}")


@dataclass(frozen=True, slots=True)
class LogTail(Frame):
    TYPE: ClassVar[str] = "log_tail"
    SENDERS: ClassVar[tuple[Sender, ...]] = ("agent",)
    deployment_id: str
    lines: list[str]
    command_id: str | None = None  # the `command` this answers


# ---- control plane -> agent -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What to serve. `source` is a path or hub id passed to vLLM's --model."""

    name: str
    source: str
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    max_context_len: int | None = None
    # Free-form engine knobs; the agent reads "aqua" (bool), "kv_cache_bytes", "max_num_seqs",
    # "enforce_eager", "gpu_memory_utilization", "seed" and "extra_args" (list of CLI strings).
    engine_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check(bool(self.name), "name", "must not be empty")
        check(bool(self.source), "source", "must not be empty")
        tp = self.tensor_parallel_size
        check(tp >= 1, "tensor_parallel_size", f"must be >= 1, got {tp}")
        m = self.max_context_len
        check(m is None or m >= 1, "max_context_len", f"must be >= 1, got {m}")


@dataclass(frozen=True, slots=True)
class DeploymentSpec:
    id: str
    model: ModelSpec
    devices: list[int]  # host-local device indices
    # The key the engine takes generation requests with (vLLM's VLLM_API_KEY), which the gateway
    # sends: without it anyone who reaches the host could use the engine past the gateway's keys and
    # quotas. "" starts the engine without one. Never in a repr (the agent logs specs).
    api_key: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        check(bool(self.id), "id", "must not be empty")
        check(bool(self.devices), "devices", "must name at least one device")
        check(len(set(self.devices)) == len(self.devices), "devices", "duplicate device index")
        in_range = all(0 <= d <= MAX_DEVICE_INDEX for d in self.devices)
        check(in_range, "devices", f"indices must be in 0..{MAX_DEVICE_INDEX}")


@dataclass(frozen=True, slots=True)
class DesiredDeployments(Frame):
    """The complete desired state: deployments absent from the list are stopped."""

    TYPE: ClassVar[str] = "desired_deployments"
    SENDERS: ClassVar[tuple[Sender, ...]] = ("control_plane",)
    deployments: list[DeploymentSpec]

    def __post_init__(self) -> None:
        ids = [d.id for d in self.deployments]
        check(len(set(ids)) == len(ids), "deployments", f"duplicate deployment id in {ids}")


@dataclass(frozen=True, slots=True)
class Command(Frame):
    """One action. `restart_deployment` restarts the engine; `tail_log` asks for a `log_tail`."""

    TYPE: ClassVar[str] = "command"
    SENDERS: ClassVar[tuple[Sender, ...]] = ("control_plane",)
    command_id: str
    action: Literal["restart_deployment", "tail_log"]
    deployment_id: str
    lines: int = 100  # for tail_log

    def __post_init__(self) -> None:
        check(1 <= self.lines <= 10_000, "lines", f"must be in 1..10000, got {self.lines}")


@dataclass(frozen=True, slots=True)
class ErrorFrame(Frame):
    """Tells the peer a frame was rejected (`code`: "bad_frame", "unauthorized", ...)."""

    TYPE: ClassVar[str] = "error"
    SENDERS: ClassVar[tuple[Sender, ...]] = ("agent", "control_plane")
    code: str
    message: str
    field: str | None = None


FRAME_TYPES: dict[str, type[Frame]] = {
    cls.TYPE: cls
    for cls in (
        Register,
        Heartbeat,
        Telemetry,
        DeploymentStatus,
        LogTail,
        DesiredDeployments,
        Command,
        ErrorFrame,
        Probe,
        ProbeReport,
    )
}


def parse_frame(data: Any, sender: Sender | None = None) -> Frame:
    """Validate a decoded JSON message and return its typed frame.

    Args:
        data: The decoded JSON value.
        sender: If given, frames that this side may not send are rejected (e.g. the agent
            parses with sender="control_plane" and refuses a `telemetry` frame).

    Raises:
        ProtocolError: naming the first bad field ("v", "type", "devices[0].uuid", ...).
    """
    if not isinstance(data, dict):
        raise ProtocolError("", f"expected a JSON object, got {type(data).__name__}")
    if "v" not in data:
        raise ProtocolError("v", "required field is missing")
    if data["v"] != PROTOCOL_VERSION or isinstance(data["v"], bool):
        raise ProtocolError("v", f"unsupported protocol version {data['v']!r} (this side speaks 1)")
    kind = data.get("type")
    cls = FRAME_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        known = ", ".join(sorted(FRAME_TYPES))
        raise ProtocolError("type", f"unknown frame type {kind!r}; known: {known}")
    if sender is not None and sender not in cls.SENDERS:
        raise ProtocolError("type", f"a {sender} may not send {kind!r} frames")
    body = {k: v for k, v in data.items() if k not in ("v", "type")}
    return decode(cls, body)


def decode_json(text: str | bytes) -> Any:
    """The JSON value of one websocket message, before `parse_frame` checks it.

    Raises:
        ProtocolError: not valid JSON, or nested too deeply to decode (``json`` raises
            RecursionError past about a thousand levels: ``"[" * 200000`` is a short message).
    """
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError("", f"not valid JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("", "not valid JSON: nested too deeply") from None


def loads(text: str | bytes, sender: Sender | None = None) -> Frame:
    """Parse one websocket message; invalid JSON is a ProtocolError too."""
    return parse_frame(decode_json(text), sender)


def dumps(frame: Frame) -> str:
    """Serialise a frame to the JSON text sent on the websocket."""
    return json.dumps(frame.to_dict(), allow_nan=False, separators=(",", ":"))
