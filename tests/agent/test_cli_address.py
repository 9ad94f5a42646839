"""`--address` and `--engine-bind`: a host name or IP address alone, as the control plane uses it.

The gateway reaches an engine at ``http://<address>:<port>`` (agents.services.replica_url), the port
being the one the agent's engine reports; engines bind ``--engine-bind``. A port, scheme or path in
either used to be accepted and stored, and every replica URL built from it was wrong. A `register`
frame's `address` is checked by the same function (gpu_agent.protocol.host_address), so the control
plane stores no address the agent would have refused.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from gpu_agent.cli import main, make_config
from gpu_agent.protocol import MAX_ADDRESS_LENGTH, ProtocolError, Register, host_address, parse_frame

BASE = ["--control-plane", "http://cp", "--token", "t"]


def never_started(*args: object, **kwargs: object) -> None:
    raise AssertionError("the agent was started with a value it should have refused")


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("10.0.0.5:9000", "HOST:PORT"),
        ("gpu-1:8001", "HOST:PORT"),
        ("[::1]:9000", "HOST:PORT"),
        ("http://10.0.0.5", "URL"),
        ("10.0.0.5/24", "URL or path"),
        ("gpu 1", "whitespace"),
        ("[10.0.0.5]", "IPv6 addresses only"),
        ("[::1", "unclosed"),
        ("fe80::1%eth0", "zone id"),
        ("0.0.0.0", "unspecified"),
        ("10.0.0.256", "not an IP address"),
        ("-gpu", "not a host name"),
        ("a" * 254, "at most 253"),
    ],
)
def test_it_refuses_an_address_that_is_not_a_host_name_or_ip(address: str, why: str) -> None:
    with pytest.raises(ValueError) as err:
        make_config([*BASE, "--simulate", "1xH100", f"--address={address}"])
    # A long value is named by its start and its length.
    assert str(err.value).startswith(f"--address={address[:40]!r}") and why in str(err.value)


def test_the_command_line_exits_2_naming_the_address(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpu_agent.cli.Agent", never_started)
    assert main([*BASE, "--simulate", "1xH100", "--address", "10.0.0.5:9000"]) == 2
    assert "address='10.0.0.5:9000' looks like HOST:PORT" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("address", "stored", "bind"),
    [
        ("10.1.2.3", "10.1.2.3", "10.1.2.3"),
        ("gpu-1.example.com", "gpu-1.example.com", "0.0.0.0"),
        ("agent", "agent", "0.0.0.0"),
        ("2001:db8::7", "2001:db8::7", "2001:db8::7"),
        ("[2001:db8::7]", "2001:db8::7", "2001:db8::7"),  # brackets taken off: engines bind it
    ],
)
def test_it_accepts_host_names_and_ip_addresses(address: str, stored: str, bind: str) -> None:
    cfg = make_config([*BASE, "--address", address])
    assert (cfg.address, cfg.engine_bind) == (stored, bind)


def test_it_checks_the_engine_bind_address_the_same_way_but_allows_every_interface() -> None:
    assert make_config([*BASE, "--engine-bind", "0.0.0.0"]).engine_bind == "0.0.0.0"
    assert make_config([*BASE, "--engine-bind", "[::]"]).engine_bind == "::"
    for bad in ("127.0.0.1:8001", "", "http://0.0.0.0"):
        with pytest.raises(ValueError, match=f"^--engine-bind={re.escape(repr(bad))}"):
            make_config([*BASE, "--engine-bind", bad])


def test_a_config_file_address_is_checked_too(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("control_plane: http://cp\ntoken: t\naddress: 10.0.0.5:9000\n")
    with pytest.raises(ValueError, match=re.escape("address='10.0.0.5:9000' looks like HOST:PORT")):
        make_config(["--config", str(path)])


def register(address: str) -> dict[str, Any]:
    return {
        "v": 1,
        "type": "register",
        "host": "gpu-1",
        "address": address,
        "agent_version": "0.1.0",
        "simulated": True,
        "devices": [],
    }


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("10.0.0.5:9000", "HOST:PORT"),
        ("http://10.0.0.5", "URL"),
        ("0.0.0.0", "unspecified"),
        (" ", "is empty"),
        ("a" * 254, "at most 253"),
        ("a" * (MAX_ADDRESS_LENGTH + 1), f"limit of {MAX_ADDRESS_LENGTH} characters"),
        ("a." * 1000, f"limit of {MAX_ADDRESS_LENGTH} characters"),
    ],
)
def test_a_register_frame_with_an_address_the_gateway_could_not_use_is_a_bad_frame(
    address: str, why: str
) -> None:
    # The agent checks its --address, but the control plane stored whatever a register carried.
    with pytest.raises(ProtocolError) as refused:
        parse_frame(register(address), sender="agent")
    assert refused.value.field == "address"
    assert "must be a host name or IP address, with no port or scheme" in refused.value.reason
    assert why in refused.value.reason
    assert len(refused.value.reason) < 300  # a long value is not echoed whole


@pytest.mark.parametrize("address", ["10.0.0.5", "gpu-1.example.com", "2001:db8::7", "[2001:db8::7]", ""])
def test_a_register_frame_takes_a_host_name_an_ip_or_no_address_yet(address: str) -> None:
    frame = parse_frame(register(address), sender="agent")
    assert isinstance(frame, Register) and frame.address == address


def test_the_agent_the_protocol_and_the_control_plane_check_addresses_with_one_function() -> None:
    from gpu_agent import config

    assert config.host_address is host_address
    with pytest.raises(ValueError, match=f"limit of {MAX_ADDRESS_LENGTH} characters"):
        host_address("a" * (MAX_ADDRESS_LENGTH + 1))
