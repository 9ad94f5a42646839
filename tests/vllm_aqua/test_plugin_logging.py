"""The plug-ins' INFO records reach the engine's log: vLLM configures only its own `vllm` logger,
and the `serving.*` loggers fell back to Python's last resort (WARNING and above only)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return out.stdout + out.stderr


def test_a_plugin_info_record_reaches_vllms_log_even_when_vllm_configures_logging_later() -> None:
    text = _run(
        "import logging\n"
        "import serving.vllm_ext.scheduler as s\n"  # imported before vLLM's logging is configured
        "from vllm.config.logging import LoggingConfig\n"
        "from vllm.logger import configure_logging\n"
        "configure_logging(LoggingConfig())\n"
        "s.logger.info('AquaScheduler: policy %s', 'ecoserve')\n"
        "logging.getLogger('serving.other').debug('not at INFO')\n"
    )
    lines = [line for line in text.splitlines() if "AquaScheduler" in line]
    assert len(lines) == 1 and "INFO" in lines[0] and "policy ecoserve" in lines[0]  # vLLM's format
    assert "not at INFO" not in text


def test_without_vllms_logging_a_plugin_warning_still_reaches_stderr() -> None:
    text = _run("import serving.vllm_ext.offload_worker as w\nw.logger.warning('aqua: no room')\n")
    assert "aqua: no room" in text
