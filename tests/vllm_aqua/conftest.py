"""Session fixtures for the real-engine Aqua tests: the tiny model, a coordinator with a lending
producer, and as few vLLM CPU engines as the tests need (engine start costs 15-90 s here)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.vllm_aqua import engines

pytest.importorskip("vllm")

PROMPTS = engines.make_prompts(10, seed=1)
MAX_TOKENS = 40
SMALL_KV_TOKENS = 320  # 10 blocks for ~10 requests of up to ~150 tokens: many preemptions
LENT_BYTES = 4 << 20


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from scripts.build_tiny_model import build_model

    return build_model(engines.REPO / "var" / "models" / "tiny-llama")


class Lender:
    """A coordinator and a producer process lending one shared-memory region."""

    def __init__(self, root: Path) -> None:
        self.socket = str(root / "coord.sock")
        env = engines.engine_environ()
        self.coord = subprocess.Popen(
            [sys.executable, "-m", "serving.aqua.coordinator", "--socket", self.socket],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=engines.REPO,
        )
        assert self.coord.stdout is not None
        assert json.loads(self.coord.stdout.readline())["event"] == "listening"
        self.producer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "serving.aqua.producer",
                "--socket",
                self.socket,
                "--device",
                "cpu0",
                "--nbytes",
                str(2 * LENT_BYTES),
                "--producer-id",
                "test-producer",
                "--reclaim-timeout",
                "60",
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=engines.REPO,
        )
        self.events: list[dict[str, Any]] = [self.next_event()]
        assert self.events[0]["event"] == "leased", self.events

    def next_event(self) -> dict[str, Any]:
        assert self.producer.stdout is not None
        line = self.producer.stdout.readline()
        return json.loads(line) if line else {"event": "eof"}

    def close(self) -> None:
        for proc in (self.producer, self.coord):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


@pytest.fixture(scope="session")
def lender(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lender]:
    pytest.importorskip("serving.aqua.producer")
    lender = Lender(tmp_path_factory.mktemp("aqua-coord"))
    yield lender
    lender.close()


@pytest.fixture(scope="session")
def reference(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[engines.Completion]:
    """Outputs of an engine whose KV cache holds every request at once (no preemption)."""
    stats = tmp_path_factory.mktemp("ref-stats")
    llm = engines.make_llm(model_dir, 4096, additional={"aqua_policy": "fcfs", "aqua_stats_dir": str(stats)})
    try:
        out = engines.generate(llm, PROMPTS, MAX_TOKENS)
    finally:
        engines.shutdown(llm)
    assert engines.counters(stats, "scheduler.json").get("preemptions", 0) == 0
    return out


class AquaEngine:
    def __init__(self, llm: Any, stats: Path, corrupt_file: Path) -> None:
        self.llm, self.stats, self.corrupt_file = llm, stats, corrupt_file

    def sched(self, settle_s: float = 0.3) -> dict[str, Any]:
        return engines.counters(self.stats, "scheduler.json", settle_s)

    def worker(self, settle_s: float = 0.3) -> dict[str, Any]:
        return engines.counters(self.stats, "offload-worker.json", settle_s)


@pytest.fixture(scope="session")
def aqua(
    model_dir: Path,
    lender: Lender,
    reference: list[engines.Completion],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[AquaEngine]:
    """Small KV cache + Aqua scheduler + Aqua connector (lent region first, then DRAM)."""
    root = tmp_path_factory.mktemp("aqua")
    connector = engines.aqua_kv_transfer(
        coordinator=lender.socket,
        consumer_id="test-engine",
        lent_bytes=LENT_BYTES,
        dram_bytes=256 << 20,
        stats_dir=str(root),
        test_corrupt_file=str(root / "CORRUPT"),
    )
    llm = engines.make_llm(
        model_dir, SMALL_KV_TOKENS, connector=connector, additional={"aqua_stats_dir": str(root)}
    )
    yield AquaEngine(llm, root, root / "CORRUPT")
    engines.shutdown(llm)


@pytest.fixture(scope="session")
def recompute(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AquaEngine]:
    """The same small cache and Aqua scheduler without the connector: preemption recomputes."""
    root = tmp_path_factory.mktemp("recompute")
    llm = engines.make_llm(model_dir, SMALL_KV_TOKENS, additional={"aqua_stats_dir": str(root)})
    yield AquaEngine(llm, root, root / "CORRUPT")
    engines.shutdown(llm)


@pytest.fixture
def wait_for() -> Any:
    def wait(pred: Any, timeout: float = 60.0, interval: float = 0.05) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return True
            time.sleep(interval)
        return False

    return wait
