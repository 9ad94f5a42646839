"""Per-iteration latency, KV sizes and transfer costs."""

from serving.costmodel.config import LLAMA_2_13B, LLAMA_3_8B, LLAMA_3_70B, ModelConfig, get_model_config
from serving.costmodel.fit import fit_cost_model, fit_decode, fit_prefill
from serving.costmodel.gpus import GpuSpec, get_gpu
from serving.costmodel.model import CostModel, PhaseCoeffs
from serving.costmodel.presets import (
    Efficiency,
    available_presets,
    derive_cost_model,
    get_preset,
    kv_capacity_tokens,
)
from serving.costmodel.transfer import (
    HOST_MEMCPY,
    NVLINK3,
    NVLINK4,
    PCIE5_X16,
    Link,
    kv_bytes,
    kv_transfer_seconds,
    nvlink,
)

__all__ = [
    "HOST_MEMCPY",
    "LLAMA_2_13B",
    "LLAMA_3_8B",
    "LLAMA_3_70B",
    "NVLINK3",
    "NVLINK4",
    "PCIE5_X16",
    "CostModel",
    "Efficiency",
    "GpuSpec",
    "Link",
    "ModelConfig",
    "PhaseCoeffs",
    "available_presets",
    "derive_cost_model",
    "fit_cost_model",
    "fit_decode",
    "fit_prefill",
    "get_gpu",
    "get_model_config",
    "get_preset",
    "kv_bytes",
    "kv_capacity_tokens",
    "kv_transfer_seconds",
    "nvlink",
]
