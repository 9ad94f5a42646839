"""A KV connector that does nothing: the control in benchmarks/aqua_burst.py's attribution.

Loading any KV connector switches on vLLM 0.32's per-step connector hooks (metadata built by the
scheduler and shipped to the worker with every step, the worker's bind/start-load/wait-for-save/
output round, the per-layer wrappers around attention). An engine with this connector measures
what those hooks cost on their own, so that the Aqua connector's own cost can be told apart from
them. It never reports a cached token, so vLLM's scheduler behaves exactly as without a connector.
Benchmarks only: it is not a connector anyone should serve with.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata


class NoopConnector(KVConnectorBase_V1):
    """Every hook returns at once; no tokens are ever matched, saved or loaded."""

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()
