"""AquaConnector: offload a preempted request's KV to lent memory (else DRAM), restore it on
re-admission instead of recomputing.

Load it into an unmodified vLLM 0.32 with

    kv_transfer_config={"kv_connector": "AquaConnector",
                        "kv_connector_module_path": "serving.vllm_ext.connector",
                        "kv_role": "kv_both",
                        "kv_connector_extra_config": {...}}   # see OffloadConfig

The scheduler side (OffloadPlanner) runs in the engine-core process, the worker side
(OffloadWorker) in each worker; they talk only through the per-step metadata and the worker
metadata that comes back. A missing or failed load makes vLLM recompute (the connector sets
`kv_load_failure_policy` to "recompute"), so the worst case is lost time, never wrong tokens.
Supports one KV cache group (standard decoder attention). Verified with `async_scheduling=False`
and prefix caching off; with prefix caching on, only the tokens beyond the local hit are loaded.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from serving.aqua.offload.dram import DramStore
from serving.aqua.offload.paged import PagedKV
from serving.aqua.offload.stats import StatsFile
from serving.aqua.offload.store import KVStore
from serving.vllm_ext.offload_config import OffloadConfig
from serving.vllm_ext.offload_meta import AquaConnectorMetadata
from serving.vllm_ext.offload_planner import OffloadPlanner
from serving.vllm_ext.offload_worker import OffloadWorker

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)


def build_stores(config: OffloadConfig) -> list[KVStore]:
    """The worker's tiers in order: a lent region (when a coordinator is configured), then DRAM."""
    stores: list[KVStore] = []
    if config.coordinator:
        from serving.aqua.offload.lent import LentRegionStore

        stores.append(
            LentRegionStore(
                config.coordinator,
                config.consumer_id,
                config.lent_bytes,
                call_timeout_s=config.coordinator_timeout_s,
            )
        )
    if config.dram_bytes > 0:
        stores.append(DramStore(config.dram_bytes))
    return stores


class AquaConnector(KVConnectorBase_V1):
    """vLLM KV connector that swaps preempted requests' KV out and back in (Aqua)."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.config = OffloadConfig.from_extra(self._kv_transfer_config.kv_connector_extra_config)
        if len(kv_cache_config.kv_cache_groups) != 1:
            raise ValueError("AquaConnector supports models with one KV cache group")
        self._num_blocks = kv_cache_config.num_blocks
        self._planner: OffloadPlanner | None = None
        self._worker: OffloadWorker | None = None
        self._sched_stats: StatsFile | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._planner = OffloadPlanner(vllm_config.cache_config.block_size)
            if self.config.stats_dir:
                self._sched_stats = StatsFile(Path(self.config.stats_dir) / "offload-scheduler.json")
            if self._kv_transfer_config.kv_load_failure_policy != "recompute":
                # The scheduler reads this right after building its connector: a lost offload
                # must be recomputed, not fail the request.
                self._kv_transfer_config.kv_load_failure_policy = "recompute"
                logger.info("AquaConnector: kv_load_failure_policy set to 'recompute'")
        else:
            self._worker = OffloadWorker(self.config, build_stores(self.config))

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a dropped offload is only a recompute

    # -- worker side ---------------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        self._worker.register(PagedKV(list(kv_caches.values()), self._num_blocks))

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        assert self._worker is not None and isinstance(kv_connector_metadata, AquaConnectorMetadata)
        self._worker.run_saves(kv_connector_metadata)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        assert self._worker is not None
        meta = self._get_connector_metadata()
        assert isinstance(meta, AquaConnectorMetadata)
        self._worker.run_loads(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads complete in start_load_kv, before the forward pass

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        return  # saves happen only on preemption (handle_preemptions)

    def wait_for_save(self) -> None:
        return

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_invalid_blocks() if self._worker is not None else set()

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        return self._worker.take_worker_meta() if self._worker is not None else None

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()
        if self._sched_stats is not None:
            self._sched_stats.close()

    # -- scheduler side ------------------------------------------------------------------------------
    def get_loaded_kv_cache_group_ids(self, request: Request) -> tuple[int, ...]:
        return tuple(range(len(self._kv_cache_config.kv_cache_groups)))

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        assert self._planner is not None
        return self._planner.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        assert self._planner is not None
        self._planner.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self._planner is not None
        meta = self._planner.build_connector_meta(scheduler_output)
        if self._sched_stats is not None and (meta.saves or meta.loads or meta.drops):
            self._sched_stats.publish(dict(self._planner.counters))
        return meta

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        if self._planner is not None:
            self._planner.update_connector_output(
                connector_output.kv_connector_worker_meta, connector_output.invalid_block_ids
            )

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if self._planner is not None:
            self._planner.request_finished(request.request_id)
        return False, None

    @property
    def planner(self) -> OffloadPlanner | None:
        """Scheduler-side bookkeeping (None in workers); the Aqua scheduler reads its counters."""
        return self._planner
