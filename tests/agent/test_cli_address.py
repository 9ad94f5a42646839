"""`--address` and `--engine-bind`: a host name or IP address alone, as the control plane uses it.

The gateway reaches an engine at ``http://<address>:<port>`` (agents.services.replica_url), the port
being the one the agent's engine reports; engines bind ``--engine-bind``. A port, scheme or path in
either used to be accepted and stored, and every replica URL built from it was wrong.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpu_agent.cli import main, make_config

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
    assert str(err.value).startswith(f"address={address!r}") and why in str(err.value)


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
        with pytest.raises(ValueError, match=f"engine_bind={bad!r}"):
            make_config([*BASE, "--engine-bind", bad])


def test_a_config_file_address_is_checked_too(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("control_plane: http://cp\ntoken: t\naddress: 10.0.0.5:9000\n")
    with pytest.raises(ValueError, match=re.escape("address='10.0.0.5:9000' looks like HOST:PORT")):
        make_config(["--config", str(path)])
