"""Agent configuration: a typed dataclass filled from a YAML file and/or the command line."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import socket
import unicodedata
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml

from gpu_agent.address import host_address, quoted
from gpu_agent.link import agent_ws_url, redacted_url, refuse_user_info
from gpu_agent.protocol import MAX_HEARTBEAT_INTERVAL_S, MAX_HOST_NAME_LENGTH

SIM_MAX_DEVICES = 16
# The shortest --telemetry-interval-s. Each beat is a telemetry frame and a heartbeat; the control
# plane ingested about 1,000 telemetry frames/s in all on 2 CPUs (benchmarks/results/
# telemetry_ingest.json), so one agent at 0.05 s (20 frames/s) takes a few percent of it, while a
# shorter one (1e-300 was accepted) sends as fast as its loop runs and starves every other host.
MIN_TELEMETRY_INTERVAL_S = 0.05
# The largest --sim-seed: a 32-bit seed. The simulated workloads are numpy generators seeded from
# it (gpu_agent.sim_engine.WorkloadStream -> numpy.random.SeedSequence, which takes any size), but
# 32 bits is what every numpy seeding API takes (RandomState's limit) and ample for a simulation.
MAX_SIM_SEED = 2**32 - 1
# The largest --sim-rate (requests/s per simulated consumer engine). Workloads are generated a
# minute at a time (gpu_agent.sim_engine.SEGMENT_S): 1,000/s is 60,000 requests (0.2 s to draw, a
# few MB; bursts reach 4x), while 1e9 was accepted and, once an engine started, failed inside the
# running agent (MemoryError: 492 GiB of arrival times; 1e308: "more than an array can hold").
MAX_SIM_RATE = 1000.0
# The bounds of --health-timeout-s, how long a starting engine may take to answer /health before it
# is stopped as failed. No engine starts faster than the shortest (vLLM loads the weights, profiles
# memory and allocates its KV cache: 15-25 s for a tiny model on a CPU); 1e-300 was accepted and
# stopped every engine as it started. Past the longest (a day, for weights fetched over a slow
# link), a stuck start would keep its GPUs from every other deployment.
MIN_HEALTH_TIMEOUT_S = 10.0
MAX_HEALTH_TIMEOUT_S = 86_400.0
# The bounds of the liveness probes of a running engine's /health (engines/liveness.py). vLLM answers
# /health from the event loop that also serves requests, so a probe shorter than a second, or a
# timeout shorter than one, would fail engines that are only busy; past an hour between probes, or
# 100 failures in a row, a hung engine keeps its GPUs and its share of the traffic for most of a day.
MIN_LIVENESS_S = 1.0
MAX_LIVENESS_INTERVAL_S = 3600.0
MAX_LIVENESS_TIMEOUT_S = 600.0
MAX_LIVENESS_FAILURES = 100
# The bounds of --readings-max-age-s, how old the last device sample may be and still be reported
# (device_readings.py); older, every device reports unknown readings. NVML takes tens of ms a GPU,
# but more on a loaded host: under a second, devices would flip to unknown on a sample that is only
# slow; past ten minutes, a hung driver's last readings would pass for current ones that long.
MIN_READINGS_MAX_AGE_S = 1.0
MAX_READINGS_MAX_AGE_S = 600.0
# The most --buffer-size: telemetry frames kept while disconnected, all sent on reconnecting. One
# hour at the default interval (1 s); the control plane ingests about 1,000 frames/s from all its
# hosts (benchmarks/results/telemetry_ingest.json), so a larger backlog (sys.maxsize was accepted,
# and held in memory while the link was down) takes seconds of it from every other host.
MAX_BUFFER_SIZE = 3600


# --address when this host's outward IP cannot be found (no route: an isolated network namespace).
FALLBACK_ADDRESS = "127.0.0.1"


def outward_ip() -> str | None:
    """This host's outward-facing IP (no packet is sent), or None when there is no route out."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return str(s.getsockname()[0])
    except OSError:
        return None


def default_address() -> str:
    """This host's outward-facing IP, else `FALLBACK_ADDRESS` (cli warns of it at start)."""
    return outward_ip() or FALLBACK_ADDRESS


def is_loopback_host(host: str | None) -> bool:
    """Whether `host` (a URL's host name or IP) names this machine's loopback interface."""
    if not host:
        return False
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def fallback_address_warning(cfg: AgentConfig, address_given: bool) -> str | None:
    """The WARNING to log at start when --address fell back to the loopback address (the outward
    IP could not be found) while the control plane is on another machine: its gateway would send
    requests for this host's engines to its own loopback. None when the address was given, the
    host is simulated (no engine is reached) or the control plane is itself on loopback."""
    if address_given or cfg.simulate is not None or cfg.address != FALLBACK_ADDRESS:
        return None
    if is_loopback_host(urlsplit(cfg.control_plane).hostname):
        return None
    gateway = redacted_url(cfg.control_plane)
    return (
        f"Could not determine this host's outward IP address; engines are announced on the fallback"
        f" --address {FALLBACK_ADDRESS}, which the control plane's gateway ({gateway}, on"
        " another machine) would take for its own loopback. Set --address (or `address:` in the"
        " config file) to this host's name or IP."
    )


def plaintext_token_warning(control_plane: str) -> str | None:
    """The WARNING to log at start when the host token would cross the network unencrypted: the
    control plane URL is http:// or ws:// to a host other than this machine's loopback. Not
    refused: a docker-compose network (http://web:8000) is private and serves plain http."""
    parts = urlsplit(control_plane)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "ws") or is_loopback_host(parts.hostname):
        return None
    return (
        f"The control plane URL {redacted_url(control_plane)} is plain {scheme}:// to another machine: this"
        " host's token is sent unencrypted on every connection, readable (and reusable) by anyone"
        " on the network path. Use https:// (or wss://) unless that network is private (a"
        " docker-compose network, say)."
    )


def sim_gpu_kinds() -> dict[str, int]:
    """Simulated GPU kind (upper case) -> memory bytes per device."""
    from serving.costmodel.gpus import GPU_SPECS

    return {name.upper(): spec.memory_bytes for name, spec in sorted(GPU_SPECS.items())}


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _check_url(url: str) -> None:
    """Refuse a control plane URL the link could never connect to, or one with user information
    (ValueError naming it, its user information redacted)."""
    shown = redacted_url(url)
    try:
        parts = urlsplit(agent_ws_url(url))  # agent_ws_url raises on a bad scheme
        parts.port  # noqa: B018  (raises on a port that is not a number in 0..65535)
    except ValueError as exc:
        if repr(shown) in str(exc):
            raise
        raise ValueError(f"control plane URL {shown!r}: {exc}") from None
    if not parts.hostname:
        raise ValueError(f"control plane URL {shown!r} has no host name")
    if parts.port == 0:
        raise ValueError(f"control plane URL {shown!r}: port 0 is no port to connect to")
    if any(c.isspace() for c in url):
        raise ValueError(f"control plane URL {shown!r} contains whitespace")
    refuse_user_info(url)


def parse_simulate_spec(spec: str) -> tuple[int, str]:
    """ "8xH100" -> (8, "H100"). Raises ValueError naming the value and the valid kinds."""
    kinds = sim_gpu_kinds()
    valid = ", ".join(kinds)
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*([A-Za-z0-9]+)\s*", spec)
    if match is None:
        raise ValueError(f"--simulate {spec!r} is not COUNTxKIND (e.g. 8xH100); GPU kinds: {valid}")
    count, kind = int(match.group(1)), match.group(2).upper()
    if kind not in kinds:
        raise ValueError(
            f"--simulate {spec!r}: unknown GPU kind {match.group(2)!r}; valid GPU kinds: {valid}"
        )
    if not 1 <= count <= SIM_MAX_DEVICES:
        raise ValueError(f"--simulate {spec!r}: device count must be 1..{SIM_MAX_DEVICES}, got {count}")
    return count, kind


@dataclass
class AgentConfig:
    """Everything `python -m gpu_agent` needs. YAML keys are these field names."""

    control_plane: str = field(metadata={"help": "control plane base URL, e.g. http://cp:8000"})
    token: str = field(metadata={"help": "this host's token (or env GPU_AGENT_TOKEN)"})
    name: str = field(default_factory=socket.gethostname, metadata={"help": "host name to register"})
    address: str = field(default_factory=default_address, metadata={"help": "address engines are reached on"})
    state_dir: str = field(default="var/agent", metadata={"help": "logs, Aqua socket, counters"})
    simulate: str | None = field(default=None, metadata={"help": "simulate a host, e.g. 8xH100"})
    sim_model: str = field(default="llama-2-13b", metadata={"help": "model preset of simulated consumers"})
    sim_rate: float = field(
        default=6.0, metadata={"help": f"requests/s per simulated consumer engine, at most {MAX_SIM_RATE:g}"}
    )
    sim_seed: int = field(default=0, metadata={"help": f"seed of the simulated workloads, 0..{MAX_SIM_SEED}"})
    telemetry_interval_s: float = field(
        default=1.0,
        metadata={
            "help": "seconds between telemetry frames and heartbeats,"
            f" {MIN_TELEMETRY_INTERVAL_S:g}..{MAX_HEARTBEAT_INTERVAL_S:g}"
        },
    )
    buffer_size: int = field(
        default=300,
        metadata={
            "help": f"telemetry frames kept while disconnected (sent on reconnecting), 1..{MAX_BUFFER_SIZE}"
        },
    )
    engine_bind: str | None = field(
        default=None,
        metadata={"help": "address engines listen on (default: --address if it is an IP, else 0.0.0.0)"},
    )
    health_timeout_s: float = field(
        default=600.0,
        metadata={
            "help": "seconds a starting engine may take to answer /health before it is stopped,"
            f" {MIN_HEALTH_TIMEOUT_S:g}..{MAX_HEALTH_TIMEOUT_S:g}"
        },
    )
    liveness_interval_s: float = field(
        default=10.0,
        metadata={
            "help": "seconds between /health probes of a running engine,"
            f" {MIN_LIVENESS_S:g}..{MAX_LIVENESS_INTERVAL_S:g}"
        },
    )
    liveness_timeout_s: float = field(
        default=5.0,
        metadata={
            "help": "seconds a running engine may take to answer a /health probe,"
            f" {MIN_LIVENESS_S:g}..{MAX_LIVENESS_TIMEOUT_S:g}"
        },
    )
    liveness_failures: int = field(
        default=3,
        metadata={
            "help": "failed /health probes in a row after which a running engine is ended as hung and"
            f" restarted, 1..{MAX_LIVENESS_FAILURES}"
        },
    )
    readings_max_age_s: float = field(
        default=5.0,
        metadata={
            "help": "seconds the last device sample is reported for while no newer one completes (a"
            " driver that hangs), then unknown readings,"
            f" {MIN_READINGS_MAX_AGE_S:g}..{MAX_READINGS_MAX_AGE_S:g}"
        },
    )
    log_level: str = field(default="INFO", metadata={"help": "DEBUG, INFO, WARNING or ERROR"})

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _refuse_control_characters(f.name, getattr(self, f.name))
        if not self.control_plane:
            raise ValueError("control_plane is required (--control-plane URL)")
        _check_url(self.control_plane)
        if not self.token:
            raise ValueError("token is required (--token, GPU_AGENT_TOKEN or the config file)")
        _refuse_non_ascii_token(self.token)
        if self.simulate is not None:
            parse_simulate_spec(self.simulate)
        for key in ("name", "address", "state_dir"):
            if not getattr(self, key).strip():
                raise ValueError(f"{key}={getattr(self, key)!r} must not be empty")
        # A YAML file's `state_dir: ~/agent` (or `--state-dir=~/agent`, which no shell expands)
        # made a directory named '~' in the working directory.
        self.state_dir = os.path.expanduser(self.state_dir)
        if len(self.name) > MAX_HOST_NAME_LENGTH:  # its Register frame could not be built
            raise ValueError(
                f"name={quoted(self.name)} is longer than the limit of {MAX_HOST_NAME_LENGTH} characters"
            )
        self.address = _checked_address("address", self.address)
        if self.engine_bind is None:
            self.engine_bind = self.address if _is_ip(self.address) else "0.0.0.0"
        else:
            self.engine_bind = _checked_address("engine_bind", self.engine_bind, unspecified_ok=True)
        interval = self.telemetry_interval_s
        if not MIN_TELEMETRY_INTERVAL_S <= interval <= MAX_HEARTBEAT_INTERVAL_S:  # also refuses nan
            raise ValueError(
                f"telemetry_interval_s={interval!r} must be in [{MIN_TELEMETRY_INTERVAL_S:g},"
                f" {MAX_HEARTBEAT_INTERVAL_S:g}] seconds: the control plane refuses a longer"
                " heartbeat interval, and a shorter one floods it with telemetry"
            )
        if not 1 <= self.buffer_size <= MAX_BUFFER_SIZE:
            raise ValueError(
                f"buffer_size={self.buffer_size!r} must be in 1..{MAX_BUFFER_SIZE} telemetry frames: all"
                " of them are sent when the link is back, and a longer backlog floods the control plane"
            )
        if not 0 < self.sim_rate <= MAX_SIM_RATE:  # also refuses nan
            raise ValueError(
                f"sim_rate={self.sim_rate!r} must be positive and at most {MAX_SIM_RATE:g} requests/s"
            )
        if not 0 <= self.sim_seed <= MAX_SIM_SEED:
            raise ValueError(f"sim_seed={self.sim_seed!r} must be in 0..{MAX_SIM_SEED} (a 32-bit seed)")
        if not MIN_HEALTH_TIMEOUT_S <= self.health_timeout_s <= MAX_HEALTH_TIMEOUT_S:  # also refuses nan
            raise ValueError(
                f"health_timeout_s={self.health_timeout_s!r} must be in [{MIN_HEALTH_TIMEOUT_S:g},"
                f" {MAX_HEALTH_TIMEOUT_S:g}] seconds: no engine starts in less, and a longer limit lets"
                " a stuck start hold its GPUs"
            )
        for key, most in (
            ("liveness_interval_s", MAX_LIVENESS_INTERVAL_S),
            ("liveness_timeout_s", MAX_LIVENESS_TIMEOUT_S),
        ):
            if not MIN_LIVENESS_S <= getattr(self, key) <= most:  # also refuses nan
                raise ValueError(
                    f"{key}={getattr(self, key)!r} must be in [{MIN_LIVENESS_S:g}, {most:g}] seconds: a"
                    " shorter one fails engines that are only busy, a longer one leaves a hung engine"
                    " serving for hours"
                )
        if not 1 <= self.liveness_failures <= MAX_LIVENESS_FAILURES:
            raise ValueError(
                f"liveness_failures={self.liveness_failures!r} must be in 1..{MAX_LIVENESS_FAILURES}"
                " failed /health probes"
            )
        if not MIN_READINGS_MAX_AGE_S <= self.readings_max_age_s <= MAX_READINGS_MAX_AGE_S:  # refuses nan
            raise ValueError(
                f"readings_max_age_s={self.readings_max_age_s!r} must be in [{MIN_READINGS_MAX_AGE_S:g},"
                f" {MAX_READINGS_MAX_AGE_S:g}] seconds: a shorter one reports devices unknown when a sample"
                " is only slow, a longer one passes a hung driver's last readings for current ones"
            )
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError(f"log_level={self.log_level!r} must be DEBUG, INFO, WARNING or ERROR")

    @classmethod
    def build(cls, file_values: dict[str, Any], overrides: dict[str, Any]) -> AgentConfig:
        """Merge a config file's values with command-line overrides (None = not given, in both)."""
        names = {f.name: f for f in dataclasses.fields(cls)}
        for key in file_values:
            if key not in names:
                raise ValueError(f"unknown config key {key!r}; known: {', '.join(sorted(names))}")
        # A key set to null (YAML `key:` or `key: null`) counts as not given, like an unset flag.
        given = {k: v for k, v in file_values.items() if v is not None}
        merged = {**given, **{k: v for k, v in overrides.items() if v is not None}}
        for key in ("control_plane", "token"):
            merged.setdefault(key, "")
        for key, value in merged.items():
            _check_type(key, value, names[key].type)
        return cls(**merged)


def _refuse_control_characters(key: str, value: Any) -> None:
    """ValueError naming ``key`` if the string ``value`` holds a control character (NUL, newline,
    ESC, ...), which a YAML file can spell ("\\0"): no path, URL, header or host name holds one, and
    a NUL made os.makedirs fail with a bare "embedded null byte" naming nothing. A token's value is
    not shown.

    Nor may a value but the state dir (a path: any bytes) hold a lone surrogate, which is how
    Python spells bytes that are not UTF-8 in a command line or the environment: a CPU host's
    device uuid failed on such a name with a bare "'utf-8' codec can't encode", a GPU host
    registered a name no frame may carry, and a control plane URL failed every connection."""
    if not isinstance(value, str):
        return
    text = redacted_url(value) if key == "control_plane" else value  # no password in a message
    shown = "" if key == "token" else f"={text!r}"
    at = next((i for i, c in enumerate(value) if unicodedata.category(c) == "Cc"), None)
    if at is not None:
        raise ValueError(f"{key}{shown} holds a control character ({value[at]!r} at index {at})")
    if key in ("state_dir", "token"):  # (a token that is not ASCII is refused on its own)
        return
    at = next((i for i, c in enumerate(value) if unicodedata.category(c) == "Cs"), None)
    if at is not None:
        raise ValueError(f"{key}{shown} holds undecodable bytes ({value[at]!r} at index {at}): not UTF-8")


def _refuse_non_ascii_token(token: str) -> None:
    """ValueError naming the first character of ``token`` that is not ASCII (not the token).

    Host tokens are ASCII (`platform/core/secrets.py`); one pasted with a document's quotes, or
    read from undecodable bytes, cannot go in the Authorization header: websockets refused it
    before every handshake (InvalidHeaderValue, whose WARNING showed the whole token) and the link
    retried for ever."""
    at = next((i for i, c in enumerate(token) if not c.isascii()), None)
    if at is not None:
        raise ValueError(
            f"token holds a character that is not ASCII ({token[at]!r} at index {at}): host tokens"
            " are ASCII; copy it again"
        )


def _checked_address(key: str, value: str, *, unspecified_ok: bool = False) -> str:
    try:
        return host_address(value, unspecified_ok=unspecified_ok)
    except ValueError as exc:
        raise ValueError(f"{key}={exc}") from None


def _check_type(key: str, value: Any, annotation: Any) -> None:
    types: dict[str, tuple[type, ...]] = {
        "str": (str,),
        "str | None": (str,),  # None never gets here: it means "not given"
        "int": (int,),
        "float": (int, float),
    }
    expected = types[str(annotation)]
    if isinstance(value, bool) or not isinstance(value, expected):
        raise ValueError(f"config key {key!r} must be {annotation}, got {value!r}")


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that repeats a key: PyYAML keeps the last value,
    so in an agent.yaml that sets `token:` twice (one left from an edit) the first line, the one
    the operator reads, would be silently ignored."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: merged keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str):
                key = key.replace("-", "_")  # control-plane and control_plane are one key
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: the base class names it
                break
            if duplicate:
                line = key_node.start_mark.line + 1
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (again on line {line})", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_config_file(path: str) -> dict[str, Any]:
    """The YAML mapping at `path`; ValueError naming the file when it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.load(f, Loader=_UniqueKeyLoader)  # a SafeLoader
    except OSError as exc:
        raise ValueError(f"cannot read config file {path!r}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"config file {path!r} is not UTF-8 text: {exc.reason} at byte {exc.start}"
        ) from None
    except ValueError as exc:  # open(): "embedded null byte"
        raise ValueError(f"cannot read config file {path!r}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"config file {path!r} is not valid YAML: {exc}") from None
    except RecursionError:  # PyYAML builds nested collections recursively ("[[[[..." 1,000 deep)
        raise ValueError(f"config file {path!r} nests its values too deeply to read") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {path!r} must hold a mapping of keys to values")
    return {str(k).replace("-", "_"): v for k, v in data.items()}
