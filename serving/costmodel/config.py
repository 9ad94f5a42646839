"""Transformer model shapes, and the KV-cache and weight sizes derived from them.

Figures are from the models' published configs (Hugging Face config.json of
meta-llama/Meta-Llama-3-8B, Llama-2-13b-hf and Meta-Llama-3-70B; parameter counts from the model
cards: 8.03B, 13.0B, 70.6B).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape of a decoder-only transformer.

    Attributes:
        name: Registry key, e.g. "llama-3-8b".
        num_layers: Decoder layers.
        hidden_size: Model (residual) width.
        num_heads: Query heads per layer.
        num_kv_heads: Key/value heads per layer (< num_heads with grouped-query attention).
        head_dim: Width of one attention head.
        intermediate_size: MLP inner width.
        vocab_size: Vocabulary size.
        dtype_bytes: Bytes per weight and per KV element (2 for fp16/bf16).
        num_params: Parameter count.
        max_context: Context window in tokens.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int
    num_params: int
    max_context: int = 4096

    def __post_init__(self) -> None:
        for field_name in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "dtype_bytes",
            "num_params",
            "max_context",
        ):
            value = getattr(self, field_name)
            if value <= 0:
                raise ValueError(f"{field_name}={value} must be positive")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads=} must be a multiple of {self.num_kv_heads=}")

    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token holds across all layers: 2 * layers * kv_heads * head_dim * dtype."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def weight_bytes(self) -> int:
        """Bytes of the weights: num_params * dtype_bytes."""
        return self.num_params * self.dtype_bytes


LLAMA_3_8B = ModelConfig("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 2, 8_030_261_248, 8192)
LLAMA_2_13B = ModelConfig("llama-2-13b", 40, 5120, 40, 40, 128, 13824, 32000, 2, 13_015_864_320, 4096)
LLAMA_3_70B = ModelConfig("llama-3-70b", 80, 8192, 64, 8, 128, 28672, 128256, 2, 70_553_706_496, 8192)

# name -> config
MODEL_CONFIGS: dict[str, ModelConfig] = {m.name: m for m in (LLAMA_3_8B, LLAMA_2_13B, LLAMA_3_70B)}


def get_model_config(name: str) -> ModelConfig:
    """The config called `name`.

    Raises:
        ValueError: Unknown name; the message lists the known ones.
    """
    try:
        return MODEL_CONFIGS[name]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; choose one of: {', '.join(sorted(MODEL_CONFIGS))}"
        ) from None
