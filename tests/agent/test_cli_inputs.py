"""Bad values for `python -m gpu_agent` (flags, config file): refused up front, naming the value.

Each of these used to be accepted and then crashed or misbehaved inside the running agent.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from gpu_agent import cli
from gpu_agent.agent import Agent
from gpu_agent.aqua_socket import UNIX_PATH_MAX
from gpu_agent.cli import main, make_config, make_host
from gpu_agent.config import (
    MAX_BUFFER_SIZE,
    MAX_HEALTH_TIMEOUT_S,
    MAX_LIVENESS_FAILURES,
    MAX_LIVENESS_INTERVAL_S,
    MAX_LIVENESS_TIMEOUT_S,
    MAX_READINGS_MAX_AGE_S,
    MAX_SIM_SEED,
    MIN_HEALTH_TIMEOUT_S,
    MIN_LIVENESS_S,
    MIN_READINGS_MAX_AGE_S,
    MIN_TELEMETRY_INTERVAL_S,
)
from gpu_agent.engines.liveness import Liveness
from gpu_agent.host import Host, LocalHost
from gpu_agent.protocol import MAX_HEARTBEAT_INTERVAL_S
from tests.agent.test_aqua_socket_path import runtime  # noqa: F401

BASE = ["--control-plane", "http://cp", "--token", "t"]


def never_started(*args: object, **kwargs: object) -> None:
    raise AssertionError("the agent was started with a value it should have refused")


def refuse_to_start_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the CLI from tmp_path (to see it makes no state directory) with an agent never started."""
    monkeypatch.setattr("gpu_agent.cli.Agent", never_started)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--sim-rate", "nan"], "--sim-rate=nan"),
        (["--sim-rate", "inf"], "--sim-rate=inf"),
        # Accepted: the first simulated engine's workload then failed inside the running agent
        # (MemoryError for 1e9; ValueError "more than an array can hold" for 1e308).
        (["--sim-rate", "1e9"], "--sim-rate=1000000000.0 must be positive and at most 1000 requests/s"),
        (["--sim-rate", "1001"], "--sim-rate=1001.0 must be positive and at most 1000"),
        (["--telemetry-interval-s", "nan"], "--telemetry-interval-s=nan"),
        (["--telemetry-interval-s", "inf"], "--telemetry-interval-s=inf"),
        (["--health-timeout-s", "nan"], "--health-timeout-s=nan"),
        # Accepted: every engine was stopped as failed the moment it started.
        (["--health-timeout-s", "1e-300"], r"--health-timeout-s=1e-300 must be in \[10, 86400\] seconds"),
        (["--health-timeout-s", "9.5"], r"--health-timeout-s=9.5 must be in \[10, 86400\]"),
        (["--health-timeout-s", "1e300"], r"--health-timeout-s=1e\+300 must be in \[10, 86400\]"),
        (["--liveness-interval-s", "nan"], "--liveness-interval-s=nan"),
        # Probes that fail engines only busy, or leave a hung one serving for hours.
        (["--liveness-interval-s", "0.5"], r"--liveness-interval-s=0.5 must be in \[1, 3600\] seconds"),
        (["--liveness-interval-s", "3601"], r"--liveness-interval-s=3601.0 must be in \[1, 3600\]"),
        (["--liveness-timeout-s", "0"], r"--liveness-timeout-s=0.0 must be in \[1, 600\] seconds"),
        (["--liveness-timeout-s", "inf"], r"--liveness-timeout-s=inf must be in \[1, 600\]"),
        (["--liveness-failures", "0"], r"--liveness-failures=0 must be in 1..100 failed /health probes"),
        (["--liveness-failures", "101"], r"--liveness-failures=101 must be in 1..100"),
        # Devices that flip to unknown readings on a sample that is only slow, or a hung driver's
        # last readings reported as current for hours.
        (["--readings-max-age-s", "nan"], "--readings-max-age-s=nan"),
        (["--readings-max-age-s", "0.5"], r"--readings-max-age-s=0.5 must be in \[1, 600\] seconds"),
        (["--readings-max-age-s", "inf"], r"--readings-max-age-s=inf must be in \[1, 600\]"),
        (["--sim-seed", "-1"], "--sim-seed=-1"),
        (["--buffer-size", str(1 << 63)], f"--buffer-size={1 << 63}"),
        # Accepted: frames kept in memory while disconnected, then all sent to the control plane.
        (
            ["--buffer-size", str(sys.maxsize)],
            f"--buffer-size={sys.maxsize} must be in 1..3600 telemetry frames",
        ),
        (["--name", ""], "--name=''"),
        # Accepted: on every connection the link failed building its Register frame (ProtocolError,
        # logged with a traceback as "failed unexpectedly") and reconnected, for ever.
        (
            ["--name", "n" * 101],
            r"--name='n{40}'\.\.\. \(101 characters\) is longer than the limit of 100",
        ),
        (["--address", " "], "--address=' '"),
        (["--state-dir", ""], "--state-dir=''"),
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


class StartedAgent:
    """Stands in for `Agent`: records the host it was given and returns at once."""

    hosts: ClassVar[list[Host]] = []

    def __init__(self, host: Host, *args: object, **kwargs: object) -> None:
        self.hosts.append(host)
        self.link = SimpleNamespace(url="ws://cp/agent")

    async def run(self) -> None:
        return None

    def stop(self) -> None:
        return None


def test_it_runs_with_a_state_dir_whose_aqua_socket_path_is_over_the_unix_limit(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    runtime: str,  # noqa: F811
) -> None:
    # make run's <checkout>/var/agents/local under a long checkout path: it used to exit 2 (and,
    # before that, the coordinator logged "AF_UNIX path too long" for the agent's whole life).
    monkeypatch.setattr("gpu_agent.cli.Agent", StartedAgent)
    monkeypatch.setattr(StartedAgent, "hosts", [])
    fits = tmp_path / ("d" * (UNIX_PATH_MAX - len(str(tmp_path)) - len("/") - len("/aqua.sock")))
    assert len(os.fsencode(fits / "aqua.sock")) == UNIX_PATH_MAX  # the longest that fits...
    host = make_host(make_config([*BASE, "--state-dir", str(fits)]))
    assert isinstance(host, LocalHost) and host.aqua is not None
    assert host.aqua.requested_socket == str(fits / "aqua.sock") and not host.aqua.private
    host.inventory.close()
    state = tmp_path / (fits.name + "d")  # ...and one byte over it
    assert main([*BASE, "--state-dir", str(state)]) == 0
    assert "error" not in capsys.readouterr().err
    (host,) = StartedAgent.hosts
    assert isinstance(host, LocalHost) and host.aqua is not None and state.is_dir()
    assert host.aqua.private and os.path.dirname(host.aqua.requested_socket) == os.path.join(
        runtime, f"gpu-agent-{os.geteuid()}"
    )
    host.inventory.close()


def test_a_simulated_host_runs_no_coordinator_so_any_state_dir_path_will_do(tmp_path: Path) -> None:
    long_dir = str(tmp_path / ("d" * (UNIX_PATH_MAX + 10)))
    assert make_host(make_config([*BASE, "--simulate", "1xH100", "--state-dir", long_dir]))


@pytest.mark.parametrize("key", ["simulate", "engine_bind", "name", "sim_seed", "state_dir"])
def test_a_null_in_the_config_file_counts_as_not_given(tmp_path: Path, key: str) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(f"control_plane: http://cp\ntoken: t\n{key}: null\n")
    assert getattr(make_config(["--config", str(path)]), key) == getattr(make_config(BASE), key)


def test_a_null_token_in_the_config_file_falls_back_to_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("control_plane: http://cp\ntoken:\n")
    monkeypatch.setenv("GPU_AGENT_TOKEN", "from-env")
    assert make_config(["--config", str(path)]).token == "from-env"
    monkeypatch.delenv("GPU_AGENT_TOKEN")
    with pytest.raises(ValueError, match="token is required"):
        make_config(["--config", str(path)])


@pytest.mark.parametrize("url", ["http://[::1", "http://[not-ipv6]:8000"])
def test_a_control_plane_url_that_does_not_parse_is_named(url: str) -> None:
    with pytest.raises(ValueError) as err:
        make_config(["--control-plane", url, "--token", "t"])
    assert repr(url) in str(err.value)


@pytest.mark.parametrize(
    ("args", "named", "bound"),
    [
        # Agent(...) raised ValueError outside cli.main's try: a traceback instead of exit 2.
        (["--telemetry-interval-s", "600"], "--telemetry-interval-s=600.0", "[0.05, 60] seconds"),
        (["--telemetry-interval-s", "60.5"], "--telemetry-interval-s=60.5", "[0.05, 60] seconds"),
        # Accepted: the agent sent telemetry frames and heartbeats as fast as its loop ran.
        (["--telemetry-interval-s", "1e-300"], "--telemetry-interval-s=1e-300", "[0.05, 60] seconds"),
        (["--telemetry-interval-s", "0.04"], "--telemetry-interval-s=0.04", "[0.05, 60] seconds"),
        # Accepted, far past any seed range (numpy's RandomState takes 32 bits).
        (["--sim-seed", "99999999999999999999999"], "--sim-seed=99999999999999999999999", "0..4294967295"),
        (["--sim-seed", str(2**32)], f"--sim-seed={2**32}", "0..4294967295"),
    ],
)
def test_the_command_line_exits_2_naming_an_interval_or_seed_out_of_range_and_its_bound(
    args: list[str],
    named: str,
    bound: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("gpu_agent.cli.Agent", never_started)
    assert main([*BASE, "--simulate", "1xH100", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m gpu_agent: error: ") and named in err and bound in err
    assert "Traceback" not in err


def test_a_config_file_interval_or_seed_out_of_range_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("control_plane: http://cp\ntoken: t\ntelemetry_interval_s: 600\n")
    with pytest.raises(ValueError, match=r"telemetry_interval_s=600 must be in \[0\.05, 60\]"):
        make_config(["--config", str(path)])
    path.write_text(f"control_plane: http://cp\ntoken: t\nsim_seed: {2**64}\n")
    with pytest.raises(ValueError, match=f"sim_seed={2**64} must be in 0..{2**32 - 1}"):
        make_config(["--config", str(path)])


def test_the_bounds_themselves_are_accepted_and_the_agent_starts_with_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[float] = []
    monkeypatch.setattr("gpu_agent.cli.asyncio.run", lambda coro: coro.close())
    real_agent = cli.Agent

    def agent(*args: Any, **kwargs: Any) -> Agent:
        started.append(kwargs["telemetry_interval_s"])
        return real_agent(*args, **kwargs)

    monkeypatch.setattr("gpu_agent.cli.Agent", agent)
    for interval, seed in ((MIN_TELEMETRY_INTERVAL_S, 0), (MAX_HEARTBEAT_INTERVAL_S, MAX_SIM_SEED)):
        argv = ["--telemetry-interval-s", str(interval), "--sim-seed", str(seed)]
        assert main([*BASE, "--simulate", "1xH100", *argv]) == 0
    assert started == [0.05, 60.0]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("health_timeout_s", MIN_HEALTH_TIMEOUT_S),
        ("health_timeout_s", MAX_HEALTH_TIMEOUT_S),
        ("buffer_size", 1),
        ("buffer_size", MAX_BUFFER_SIZE),
        ("liveness_interval_s", MIN_LIVENESS_S),
        ("liveness_interval_s", MAX_LIVENESS_INTERVAL_S),
        ("liveness_timeout_s", MIN_LIVENESS_S),
        ("liveness_timeout_s", MAX_LIVENESS_TIMEOUT_S),
        ("liveness_failures", 1),
        ("liveness_failures", MAX_LIVENESS_FAILURES),
        ("readings_max_age_s", MIN_READINGS_MAX_AGE_S),
        ("readings_max_age_s", MAX_READINGS_MAX_AGE_S),
    ],
)
def test_the_health_timeout_and_buffer_size_take_their_bounds(key: str, value: float) -> None:
    cfg = make_config([*BASE, f"--{key.replace('_', '-')}", str(value)])
    assert getattr(cfg, key) == value


def test_the_host_probes_running_engines_as_configured(tmp_path: Path) -> None:
    flags = ["--liveness-interval-s", "2", "--liveness-timeout-s", "1.5", "--liveness-failures", "4"]
    cfg = make_config([*BASE, "--state-dir", str(tmp_path), *flags])
    host = make_host(cfg)
    cli._state_locks.pop().close()  # (make_host locked the state dir for this process)
    assert isinstance(host, LocalHost)
    assert host._liveness == Liveness(interval_s=2.0, timeout_s=1.5, failures=4)


def test_the_host_ages_out_device_readings_as_configured(tmp_path: Path) -> None:
    for flags, max_age in (([], 5.0), (["--readings-max-age-s", "30"], 30.0)):
        cfg = make_config([*BASE, "--state-dir", str(tmp_path), *flags])
        host = make_host(cfg)
        cli._state_locks.pop().close()  # (make_host locked the state dir for this process)
        assert isinstance(host, LocalHost)
        assert host.readings.max_age_s == max_age


@pytest.mark.parametrize(
    ("text", "named"),
    [
        # PyYAML nests recursively: a RecursionError traceback.
        ("control_plane: http://cp\ntoken: t\nname: " + "[" * 5000 + "\n", "nests its values too deeply"),
        # os.makedirs failed with a bare "embedded null byte" naming no key, and no file.
        (
            'control_plane: http://cp\ntoken: t\nstate_dir: "var/\\0agent"\n',
            "state_dir='var/\\x00agent' holds",
        ),
        # Accepted: the name and token (an HTTP header) went to the control plane holding NUL.
        ('control_plane: http://cp\ntoken: t\nname: "gpu\\0-1"\n', "name='gpu\\x00-1' holds a control"),
        ('control_plane: http://cp\ntoken: "t\\n0k"\n', "token holds a control character ('\\n' at index 1)"),
        # Named the key but not the file.
        ("control_plane: http://cp\ntoken: t\nbuffer_size: '3'\n", "config key 'buffer_size' must be int"),
        ("control_plane: http://cp\ntoken: t\ncolour: red\n", "unknown config key 'colour'"),
        ("control_plane: http://cp\ntoken: t\nsim_seed: -1\n", "sim_seed=-1 must be in"),
        # Accepted: the link retried port 0 for ever.
        ("control_plane: http://cp:0\ntoken: t\n", "'http://cp:0': port 0 is no port"),
    ],
)
def test_a_bad_config_file_exits_2_naming_the_file_and_the_key(
    tmp_path: Path,
    text: str,
    named: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refuse_to_start_in(tmp_path, monkeypatch)
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m gpu_agent: error: config file {str(path)!r}"), err
    assert named in err and "Traceback" not in err
    assert "t\n0k" not in err  # a token is not shown
    assert list(tmp_path.iterdir()) == [path]  # no state directory


def test_a_flag_overriding_a_bad_config_value_is_not_blamed_on_the_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("control_plane: http://cp\ntoken: t\nbuffer_size: 0\n")
    assert make_config(["--config", str(path), "--buffer-size", "5"]).buffer_size == 5
    with pytest.raises(ValueError, match=r"^--sim-rate=nan must be positive"):
        make_config(["--config", str(path), "--buffer-size", "5", "--sim-rate", "nan"])


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("telemetry_interval_s", "0.04", r"telemetry-interval-s=0.04 must be in \[0.05, 60\] seconds"),
        ("buffer_size", "0", "buffer-size=0 must be in 1..3600 telemetry frames"),
        ("sim_rate", "0", "sim-rate=0.0 must be positive"),
        ("sim_seed", "-1", "sim-seed=-1 must be in 0..4294967295"),
        ("health_timeout_s", "5", r"health-timeout-s=5.0 must be in \[10, 86400\] seconds"),
        ("liveness_interval_s", "0.5", r"liveness-interval-s=0.5 must be in \[1, 3600\] seconds"),
        ("liveness_failures", "0", "liveness-failures=0 must be in 1..100"),
        ("readings_max_age_s", "0.5", r"readings-max-age-s=0.5 must be in \[1, 600\] seconds"),
        ("log_level", "LOUD", "log-level='LOUD' must be DEBUG, INFO, WARNING or ERROR"),
    ],
)
def test_a_value_out_of_range_is_named_as_the_user_wrote_it(
    tmp_path: Path, flag: str, value: str, said: str
) -> None:
    """As the flag on the command line, as the key in a config file: not as the attribute of the
    code that checked it (it read "self.telemetry_interval_s=0.04 must be ...")."""
    with pytest.raises(ValueError, match=f"^--{said}") as err:
        make_config([*BASE, f"--{flag.replace('_', '-')}", value])
    assert "self." not in str(err.value)
    path = tmp_path / "agent.yaml"
    path.write_text(f"control_plane: http://cp\ntoken: t\n{flag}: {value}\n")
    with pytest.raises(ValueError) as err:
        make_config(["--config", str(path)])
    message = str(err.value)
    assert message.startswith(f"config file {str(path)!r}: {flag}="), message
    assert "self." not in message


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ("control_plane: http://cp\ntoken: first\ntoken: second\n", "token", 3),
        ("control-plane: http://a\ntoken: t\ncontrol_plane: http://b\n", "control_plane", 3),
    ],
)
def test_a_key_given_twice_in_the_config_file_is_refused_naming_it(
    tmp_path: Path, text: str, key: str, line: int
) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"{key!r} is given twice \(again on line {line}\)"):
        make_config(["--config", str(path)])


def test_yaml_merge_keys_still_work_and_may_be_overridden(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("base: &base {control_plane: 'http://cp', token: t}\n<<: *base\ntoken: mine\n")
    with pytest.raises(ValueError, match="unknown config key 'base'"):  # merged, then refused by name
        make_config(["--config", str(path)])
    path.write_text("<<: {control_plane: 'http://cp', token: t}\ntoken: mine\n")
    assert make_config(["--config", str(path)]).token == "mine"


@pytest.mark.parametrize(
    ("token", "named"),
    [
        ("\u201cagt_secret\u201d", "'\u201c' at index 0"),  # pasted with a document's quotes
        ("agt_s\u00e9cret", "'\u00e9' at index 5"),
        ("agt_secret\udcff", "'\\udcff' at index 10"),  # undecodable bytes in $GPU_AGENT_TOKEN
    ],
)
def test_a_token_that_is_not_ascii_exits_2_without_showing_it(
    tmp_path: Path,
    token: str,
    named: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It was accepted; every connection attempt then failed before the handshake (websockets:
    # InvalidHeaderValue) and logged a WARNING holding the whole token, retrying for ever.
    refuse_to_start_in(tmp_path, monkeypatch)
    monkeypatch.setenv("GPU_AGENT_TOKEN", token)
    assert main(["--control-plane", "http://cp"]) == 2
    err = capsys.readouterr().err
    assert "token holds a character that is not ASCII" in err and named in err, err
    assert "Traceback" not in err and "agt_s" not in err


NOT_HERE = "203.0.113.77"  # TEST-NET-3: an address of no interface of this machine


@pytest.mark.parametrize(
    ("args", "named"),
    [
        # The gateway reaches the host through a NAT'd address: engines bound it by default.
        (["--address", NOT_HERE], f"--engine-bind {NOT_HERE!r} (the default: --address)"),
        (["--engine-bind", NOT_HERE], f"--engine-bind {NOT_HERE!r}: engines cannot listen"),
    ],
)
def test_an_engine_bind_address_of_no_interface_here_exits_2(
    tmp_path: Path,
    args: list[str],
    named: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It was accepted: every engine then failed to bind its port (EADDRNOTAVAIL), restarted with
    # backoff for ever, each run's failure only in the engine's log tail.
    refuse_to_start_in(tmp_path, monkeypatch)
    assert main([*BASE, *args]) == 2
    err = capsys.readouterr().err
    assert named in err and "Cannot assign requested address" in err, err
    assert "--engine-bind 0.0.0.0" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no state directory


def test_a_simulated_host_runs_no_engines_so_any_address_will_do() -> None:
    cfg = make_config([*BASE, "--simulate", "1xH100", "--address", NOT_HERE])
    assert make_host(cfg).simulated


@pytest.mark.parametrize(
    ("args", "named"),
    [
        # A CPU host failed with "'utf-8' codec can't encode character '\udcff' in position 3:
        # surrogates not allowed", naming no option; a GPU host registered a name the control plane
        # refuses (no string of a frame may hold a lone surrogate).
        (["--name", "gpu\udcff1"], "--name='gpu\\udcff1' holds undecodable bytes ('\\udcff' at index 3)"),
        # Accepted: every connection attempt failed with a UnicodeError traceback.
        (
            ["--control-plane", "http://cp\udcff:8000"],
            "--control-plane='http://cp\\udcff:8000' holds undecodable",
        ),
    ],
)
def test_a_value_holding_undecodable_bytes_exits_2_naming_it(
    tmp_path: Path,
    args: list[str],
    named: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refuse_to_start_in(tmp_path, monkeypatch)
    assert main([*BASE, *args]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err, err


def test_a_state_dir_of_undecodable_bytes_is_a_path_like_any_other(tmp_path: Path) -> None:
    path = os.fsdecode(os.fsencode(str(tmp_path)) + b"/st\xff")
    assert make_config([*BASE, "--state-dir", path]).state_dir == path
