"""Worker side of the Aqua connector: gather a victim's KV into one buffer, put it in the best
tier that has room, and scatter it back on re-admission.

Tiers are tried in order (a region lent by a paired producer, then host DRAM); when none has room
the save is reported lost and the request is recomputed. A load that finds no buffer (lost,
evacuation failed) reports its destination blocks as invalid: vLLM then recomputes them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from serving.aqua.offload.paged import PagedKV
from serving.aqua.offload.stats import OffloadStats, StatsFile
from serving.aqua.offload.store import KVStore
from serving.vllm_ext.offload_config import OffloadConfig
from serving.vllm_ext.offload_meta import AquaConnectorMetadata, AquaWorkerMetadata, LoadJob, SaveJob

logger = logging.getLogger(__name__)


class OffloadWorker:
    """Executes the scheduler's save/load jobs against the engine's paged KV caches.

    Args:
        config: Connector options.
        stores: Tiers in order of preference (e.g. [lent region, DRAM]).
    """

    def __init__(self, config: OffloadConfig, stores: Sequence[KVStore]) -> None:
        self.config = config
        self.stores = list(stores)
        self.kv: PagedKV | None = None
        self.stats = OffloadStats()
        self._where: dict[str, KVStore] = {}
        self._lost: set[str] = set()
        self._invalid: set[int] = set()
        self._publish_due = False
        self._stats_file = None
        if config.stats_dir:
            self._stats_file = StatsFile(Path(config.stats_dir) / "offload-worker.json")

    def register(self, kv: PagedKV) -> None:
        self.kv = kv

    # -- saves (before the forward pass) -------------------------------------------------------
    def run_saves(self, meta: AquaConnectorMetadata) -> None:
        self._publish_due = False
        self._poll_stores()
        for job in meta.saves:
            self._save(job)
        for req_id in meta.drops:
            self._discard(req_id)
        if meta.saves or meta.drops or self._publish_due:
            self._publish()

    def _save(self, job: SaveJob) -> None:
        assert self.kv is not None, "register_kv_caches was not called"
        self._discard(job.req_id)
        nbytes = self.kv.nbytes(len(job.block_ids))
        t0 = time.perf_counter()
        for store in self.stores:
            dest = store.reserve(job.req_id, nbytes)
            if dest is None:
                continue
            self.kv.gather(job.block_ids, dest)
            self._where[job.req_id] = store
            self.stats.saves += 1
            self.stats.bytes_offloaded += nbytes
            self.stats.saves_by_tier[store.tier] = self.stats.saves_by_tier.get(store.tier, 0) + 1
            self.stats.save_seconds += time.perf_counter() - t0
            logger.debug(
                "aqua: offloaded %s (%d tokens, %d B) to %s", job.req_id, job.num_tokens, nbytes, store.tier
            )
            return
        self.stats.save_failures += 1
        self._lost.add(job.req_id)
        logger.info("aqua: no room to offload %s (%d B); it will be recomputed", job.req_id, nbytes)

    # -- loads (before the forward pass, synchronous) ------------------------------------------------
    def run_loads(self, meta: AquaConnectorMetadata) -> None:
        if not meta.loads:
            return
        for job in meta.loads:
            self._load(job)
        self._publish()

    def _load(self, job: LoadJob) -> None:
        assert self.kv is not None, "register_kv_caches was not called"
        store = self._where.get(job.req_id)
        src = store.get(job.req_id) if store is not None else None
        if store is None or src is None or src.numel() < self.kv.nbytes(job.saved_blocks):
            self.stats.load_failures += 1
            self._invalid.update(job.block_ids)
            self._discard(job.req_id)
            logger.warning(
                "aqua: offloaded KV of %s is gone; recomputing %d blocks", job.req_id, len(job.block_ids)
            )
            return
        t0 = time.perf_counter()
        self.kv.scatter(job.block_ids, src, job.saved_blocks, job.first)
        if self._corrupt_enabled():
            self._corrupt_block(job.block_ids[0])
        self.kv.synchronize()
        self.stats.loads += 1
        self.stats.bytes_restored += self.kv.nbytes(len(job.block_ids))
        self.stats.loads_by_tier[store.tier] = self.stats.loads_by_tier.get(store.tier, 0) + 1
        self.stats.load_seconds += time.perf_counter() - t0
        self._discard(job.req_id)

    def _corrupt_enabled(self) -> bool:
        path = self.config.test_corrupt_file
        return path is not None and os.path.exists(path)

    def _corrupt_block(self, block_id: int) -> None:
        """TEST ONLY: overwrite one restored block of the first layer with seeded noise."""
        assert self.kv is not None
        cache = self.kv.caches[0]
        block = cache.select(self.kv.block_dim, block_id)
        gen = torch.Generator(device="cpu").manual_seed(block_id)
        block.copy_(torch.randn(block.shape, generator=gen).to(block.dtype))
        self.stats.corrupted_restores += 1

    # -- bookkeeping ---------------------------------------------------------------------------------
    def _discard(self, req_id: str) -> None:
        store = self._where.pop(req_id, None)
        if store is not None:
            self._sync()
            store.discard(req_id)

    def _poll_stores(self) -> None:
        """Evacuate entries of a store being reclaimed to the next tier that has room."""
        for i, store in enumerate(self.stores):
            for req_id in store.poll():
                self._publish_due = True
                src = store.get(req_id)
                moved = False
                if src is not None and self._where.get(req_id) is store:
                    for lower in self.stores[i + 1 :]:
                        dest = lower.reserve(req_id, src.numel())
                        if dest is None:
                            continue
                        dest.copy_(src)
                        self._sync()
                        self._where[req_id] = lower
                        self.stats.evacuations += 1
                        self.stats.bytes_evacuated += src.numel()
                        moved = True
                        break
                store.discard(req_id)
                if not moved and self._where.get(req_id) is store:
                    self._where.pop(req_id)
                    self._lost.add(req_id)
                    logger.warning("aqua: could not evacuate %s; it will be recomputed", req_id)

    def _sync(self) -> None:
        """Wait for in-flight side-stream copies before a source buffer is released (CUDA)."""
        if self.kv is not None:
            self.kv.synchronize()

    def take_invalid_blocks(self) -> set[int]:
        out, self._invalid = self._invalid, set()
        return out

    def take_worker_meta(self) -> AquaWorkerMetadata | None:
        if not self._lost:
            return None
        out = AquaWorkerMetadata(lost=self._lost)
        self._lost = set()
        return out

    def _publish(self) -> None:
        if self._stats_file is not None:
            data = self.stats.to_dict()
            data["held"] = {s.tier: len(s.keys()) for s in self.stores}
            self._stats_file.publish(data)

    def close(self) -> None:
        self._publish()
        if self._stats_file is not None:
            self._stats_file.close()
        for store in self.stores:
            store.close()
