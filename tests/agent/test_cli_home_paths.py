"""A path option starting with '~' is the user's home, from the config file or the command line
(`--state-dir=~/x` is not expanded by the shell): it made a directory literally named '~'."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_agent.cli import make_config

BASE = ["--control-plane", "http://cp", "--token", "t"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


def test_a_state_dir_from_the_config_file_is_expanded(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("state_dir: ~/agent-state\n")
    assert make_config([*BASE, "--config", str(path)]).state_dir == str(home / "agent-state")


def test_a_state_dir_flag_is_expanded(home: Path) -> None:
    assert make_config([*BASE, "--state-dir=~/x"]).state_dir == str(home / "x")
    assert make_config([*BASE, "--state-dir", "~"]).state_dir == str(home)
    assert make_config([*BASE, "--state-dir", "var/~x"]).state_dir == "var/~x"  # only a leading '~'


def test_the_config_file_path_is_expanded(home: Path) -> None:
    home.mkdir()
    (home / "agent.yaml").write_text("name: from-home\n")
    assert make_config([*BASE, "--config=~/agent.yaml"]).name == "from-home"
    assert not os.path.exists("~")
