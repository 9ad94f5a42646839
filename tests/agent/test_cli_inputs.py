"""Bad values for `python -m gpu_agent` (flags, config file): refused up front, naming the value.

Each of these used to be accepted and then crashed or misbehaved inside the running agent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_agent.cli import make_config, make_host

BASE = ["--control-plane", "http://cp", "--token", "t"]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--sim-rate", "nan"], "sim_rate=nan"),
        (["--sim-rate", "inf"], "sim_rate=inf"),
        (["--telemetry-interval-s", "nan"], "telemetry_interval_s=nan"),
        (["--telemetry-interval-s", "inf"], "telemetry_interval_s=inf"),
        (["--health-timeout-s", "nan"], "health_timeout_s=nan"),
        (["--sim-seed", "-1"], "sim_seed=-1"),
        (["--buffer-size", str(1 << 63)], f"buffer_size={1 << 63}"),
        (["--name", ""], "name=''"),
        (["--address", " "], "address=' '"),
        (["--state-dir", ""], "state_dir=''"),
    ],
)
def test_it_rejects_values_the_running_agent_could_not_use(args: list[str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make_config([*BASE, *args])


@pytest.mark.parametrize("url", ["http://cp:notaport", "http://cp:99999", "http://c p", "http://:8000"])
def test_it_rejects_a_control_plane_url_it_could_never_reach(url: str) -> None:
    with pytest.raises(ValueError) as err:
        make_config(["--control-plane", url, "--token", "t"])
    assert repr(url) in str(err.value)


def test_it_names_a_config_file_that_is_not_text(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_bytes(b"\xff\xfe\x00token: t\n")
    with pytest.raises(ValueError, match="not UTF-8") as err:
        make_config(["--config", str(path)])
    assert repr(str(path)) in str(err.value)


def test_an_empty_config_path_is_an_error_not_ignored() -> None:
    with pytest.raises(ValueError, match="cannot read config file ''"):
        make_config([*BASE, "--config", ""])


def test_it_refuses_a_state_dir_it_cannot_create_before_starting(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = make_config([*BASE, "--state-dir", str(blocker / "state")])
    with pytest.raises(ValueError, match="--state-dir") as err:
        make_host(cfg)
    assert repr(str(blocker / "state")) in str(err.value)
