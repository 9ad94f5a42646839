"""The wire protocol: round trips, strict validation naming the bad field, sender checks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_agent.protocol import (
    PROTOCOL_VERSION,
    Command,
    DeploymentSpec,
    DeploymentStatus,
    DesiredDeployments,
    DeviceInfo,
    DeviceSample,
    EngineSample,
    ErrorFrame,
    Frame,
    Heartbeat,
    LatencySummary,
    LogTail,
    ModelSpec,
    ProtocolError,
    Register,
    Telemetry,
    dumps,
    loads,
    parse_frame,
)


def make_frames() -> list[Frame]:
    gpu0 = DeviceInfo(0, "GPU-a", "NVIDIA H100", "gpu", 80 * 2**30, [1])
    gpu1 = DeviceInfo(1, "GPU-b", "NVIDIA H100", "gpu", 80 * 2**30, [0])
    model = ModelSpec("tiny", "/models/tiny", "float32", 1, 512, {"aqua": True, "extra_args": ["--x"]})
    return [
        Register("host-a", "10.0.0.5", "0.1.0", False, [gpu0, gpu1]),
        Heartbeat(1.5),
        Telemetry(
            ts=2.0,
            devices=[
                DeviceSample(0, 10, 70, 55.0, 61.0, 300.5, "producer", lent_bytes=5, paired_with=1),
                DeviceSample(1, 70, 10, None, None, None, "consumer", borrowed_bytes=5, paired_with=0),
            ],
            engines=[
                EngineSample(
                    "d1", "running", LatencySummary(3, 0.1, 0.4), LatencySummary(0), 0.5, 2, 1, 7, 1024
                )
            ],
            dropped=3,
        ),
        DeploymentStatus("d1", "failed", 3.0, error="boom", restarts=2, port=8001),
        LogTail("d1", ["a", "b"], command_id="c1"),
        DesiredDeployments([DeploymentSpec("d1", model, [0, 1])]),
        Command("c1", "tail_log", "d1", lines=20),
        ErrorFrame("bad_frame", "nope", "devices[0].uuid"),
    ]


@pytest.mark.parametrize("frame", make_frames(), ids=lambda f: f.TYPE)
def test_it_round_trips_every_frame_type_through_json(frame: Frame) -> None:
    text = dumps(frame)
    data = json.loads(text)
    assert data["v"] == PROTOCOL_VERSION and data["type"] == frame.TYPE
    assert loads(text) == frame


def _register_dict() -> dict[str, Any]:
    return make_frames()[0].to_dict()


@pytest.mark.parametrize(
    ("mutate", "field", "reason"),
    [
        (
            lambda d: d["devices"][1].__setitem__("memory_total_bytes", "80GB"),
            "devices[1].memory_total_bytes",
            "integer",
        ),
        (
            lambda d: d["devices"][0].__setitem__("memory_total_bytes", -1),
            "devices[0].memory_total_bytes",
            ">= 0",
        ),
        (lambda d: d["devices"][0].__setitem__("index", True), "devices[0].index", "integer"),
        (lambda d: d["devices"][0].__setitem__("kind", "tpu"), "devices[0].kind", "one of"),
        (lambda d: d["devices"][0].pop("uuid"), "devices[0].uuid", "missing"),
        (
            lambda d: d["devices"][0].__setitem__("nvlink_peers", [1, "2"]),
            "devices[0].nvlink_peers[1]",
            "integer",
        ),
        (lambda d: d.__setitem__("colour", "red"), "colour", "unknown field"),
        (lambda d: d.__setitem__("simulated", "yes"), "simulated", "boolean"),
        (lambda d: d.__setitem__("devices", {}), "devices", "list"),
        (lambda d: d["devices"][1].__setitem__("index", 0), "devices", "duplicate"),
        (lambda d: d.__setitem__("v", 2), "v", "version"),
        (lambda d: d.pop("v"), "v", "missing"),
        (lambda d: d.__setitem__("type", "hello"), "type", "unknown frame type"),
    ],
)
def test_it_rejects_bad_fields_naming_them(mutate: Any, field: str, reason: str) -> None:
    data = _register_dict()
    mutate(data)
    with pytest.raises(ProtocolError) as err:
        parse_frame(data)
    assert err.value.field == field
    assert reason in err.value.reason


def test_it_validates_ranges_inside_nested_telemetry() -> None:
    data = make_frames()[2].to_dict()
    data["engines"][0]["kv_cache_usage"] = 1.5
    with pytest.raises(ProtocolError) as err:
        parse_frame(data)
    assert err.value.field == "engines[0].kv_cache_usage"
    data["engines"][0]["kv_cache_usage"] = 0.5
    data["devices"][0]["utilization_pct"] = 101
    with pytest.raises(ProtocolError) as err:
        parse_frame(data)
    assert err.value.field == "devices[0].utilization_pct"


def test_it_accepts_integers_for_floats_but_not_nan() -> None:
    assert parse_frame({"v": 1, "type": "heartbeat", "ts": 5}) == Heartbeat(5.0)
    with pytest.raises(ProtocolError) as err:
        loads('{"v": 1, "type": "heartbeat", "ts": NaN}')
    assert err.value.field == "ts"


def test_it_rejects_frames_the_sender_may_not_send() -> None:
    text = dumps(Heartbeat(1.0))
    assert loads(text, sender="agent") == Heartbeat(1.0)
    with pytest.raises(ProtocolError) as err:
        loads(text, sender="control_plane")
    assert err.value.field == "type"
    assert loads(dumps(ErrorFrame("x", "y")), sender="control_plane") == ErrorFrame("x", "y")


def test_it_reports_invalid_json_and_non_objects() -> None:
    with pytest.raises(ProtocolError, match="not valid JSON"):
        loads("{nope")
    with pytest.raises(ProtocolError, match="JSON object"):
        loads("[1, 2]")


def test_it_rejects_desired_deployments_with_bad_specs() -> None:
    data = make_frames()[5].to_dict()
    data["deployments"][0]["model"]["tensor_parallel_size"] = 0
    with pytest.raises(ProtocolError) as err:
        parse_frame(data, sender="control_plane")
    assert err.value.field == "deployments[0].model.tensor_parallel_size"
    data = make_frames()[5].to_dict()
    data["deployments"].append(data["deployments"][0])
    with pytest.raises(ProtocolError) as err:
        parse_frame(data)
    assert err.value.field == "deployments" and "duplicate" in err.value.reason


def test_it_needs_no_third_party_imports() -> None:
    # The control plane imports this module; it must not pull the agent's runtime dependencies.
    import subprocess
    import sys

    code = (
        "import sys, gpu_agent.protocol; "
        "bad = [m for m in ('websockets', 'pynvml', 'psutil', 'httpx', 'django') if m in sys.modules]; "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _telemetry_dict() -> dict[str, Any]:
    return make_frames()[2].to_dict()


def _set(path: str, value: Any) -> Any:
    """A mutation of a frame dict: ``path`` like ``devices.0.index`` (list indices as numbers)."""

    def mutate(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = data
        for key in parents:
            target = target[int(key)] if key.isdigit() else target[key]
        target[int(last) if last.isdigit() else last] = value

    return mutate


@pytest.mark.parametrize(
    ("index", "mutate", "field"),
    [
        # Integers beyond 64 bits: a database driver raises OverflowError on them.
        (0, _set("devices.0.memory_total_bytes", 2**63), "devices[0].memory_total_bytes"),
        (0, _set("devices.0.index", 2**70), "devices[0].index"),
        (2, _set("devices.0.memory_used_bytes", 2**64), "devices[0].memory_used_bytes"),
        (2, _set("dropped", -(2**63) - 1), "dropped"),
        # Device indices and counts beyond the columns that store them.
        (0, _set("devices.0.index", 32768), "devices[0].index"),
        (0, _set("devices.0.nvlink_peers", [40000]), "devices[0].nvlink_peers"),
        (2, _set("devices.1.paired_with", -1), "devices[1].paired_with"),
        (2, _set("engines.0.running", 2**31), "engines[0].running"),
        (2, _set("engines.0.ttft.count", 2**31), "engines[0].ttft.count"),
        (3, _set("restarts", 2**31), "restarts"),
        # Times no clock shows: datetime.fromtimestamp raises OverflowError or ValueError on them.
        (1, _set("ts", 1e20), "ts"),
        (2, _set("ts", -1e15), "ts"),
        (3, _set("ts", 2.0**32), "ts"),
    ],
)
def test_it_rejects_values_beyond_what_the_receiver_can_store(index: int, mutate: Any, field: str) -> None:
    data = make_frames()[index].to_dict()
    mutate(data)
    with pytest.raises(ProtocolError) as err:
        parse_frame(data)
    assert err.value.field == field


def test_it_accepts_the_largest_values_the_receiver_can_store() -> None:
    data = _telemetry_dict()
    data["ts"] = 2.0**32 - 1
    data["devices"][0].update(index=32767, memory_used_bytes=2**63 - 1, paired_with=32767)
    data["engines"][0].update(running=2**31 - 1, bytes_offloaded=2**63 - 1)
    frame = parse_frame(data)
    assert isinstance(frame, Telemetry) and frame.devices[0].memory_used_bytes == 2**63 - 1
