"""The GPU smoke scripts refuse a value they would misread (exit 2, naming it) instead of running.

`gpu_smoke_aqua_ipc.py --device gpu7` (a typo for cuda:7) used to run the shared-memory dry run and
report RESULT PASS; `gpu_smoke.py --dtype flaot16` failed minutes later inside vLLM, and
`--logprob-tol inf` passed any logprobs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import gpu_smoke, gpu_smoke_aqua_ipc
from serving.argtypes import non_negative_float

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("device", ["gpu7", "cuda", "cuda:", "cuda:x", "cpu", "cpu1", "CUDA:0", ""])
def test_the_ipc_smoke_refuses_a_device_it_does_not_document(
    device: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        gpu_smoke_aqua_ipc.main(["--device", device])
    assert exit_.value.code == 2 and f"argument --device: {device!r}" in capsys.readouterr().err


@pytest.mark.parametrize("device", ["cuda:0", "cuda:7", "cpu0"])
def test_the_ipc_smoke_takes_cuda_devices_and_the_dry_run(device: str) -> None:
    assert gpu_smoke_aqua_ipc.device_arg(device) == device


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--dtype", "flaot16"], "argument --dtype: invalid choice: 'flaot16'"),
        (["--logprob-tol", "inf"], "argument --logprob-tol: 'inf'"),
        (["--logprob-tol", "nan"], "argument --logprob-tol: 'nan'"),
        (["--logprob-tol", "-0.1"], "argument --logprob-tol: '-0.1'"),
    ],
)
def test_the_gpu_smoke_refuses_values_it_would_misuse(
    args: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        gpu_smoke.main(args)
    assert exit_.value.code == 2 and named in capsys.readouterr().err


@pytest.mark.parametrize("value", ["abc", "-0.1", "inf"])
def test_the_gpu_smoke_words_a_bad_tolerance_as_the_other_clis_do(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its --logprob-tol is serving.argtypes' non-negative float, not a copy of its own."""
    with pytest.raises(argparse.ArgumentTypeError) as shared:
        non_negative_float(value)
    with pytest.raises(SystemExit):
        gpu_smoke.main(["--logprob-tol", value])
    assert (
        capsys.readouterr().err.strip().splitlines()[-1].endswith(f"argument --logprob-tol: {shared.value}")
    )


def test_the_gpu_smoke_runs_as_a_file_from_the_repo_root() -> None:
    """`python scripts/gpu_smoke.py` (no PYTHONPATH) finds serving/ for its argument types."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "scripts/gpu_smoke.py", "--logprob-tol", "nan"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "argument --logprob-tol: 'nan'" in out.stderr and "Traceback" not in out.stderr
