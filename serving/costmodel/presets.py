"""Cost-model presets derived from public hardware and model figures.

Derivation (P params, W = P * dtype weight bytes, L layers, H hidden size, kv KV bytes per token,
F peak dense BF16 FLOP/s, B HBM bytes/s; efficiencies from `Efficiency`):

  fixed cost per iteration (both phases)
      a = W / (B * hbm_eff) + overhead
      Every forward pass streams all weights from HBM once; `overhead` (1 ms) covers scheduling,
      sampling and kernel launches. The prefill and decode `a` are equal, so a mixed chunked-prefill
      iteration pays the weight read once (CostModel.iteration_time subtracts the smaller a).
  prefill per token
      b_p = 2 * P / (F * prefill_mfu)
      A forward pass costs ~2 FLOPs per parameter per token (Kaplan et al. 2020).
  prefill quadratic (attention)
      c_p = 2 * L * H / (F * attn_eff)
      QK^T and PV each take 2 * l^2 * H FLOPs per layer; the causal mask halves the total.
  decode per context token
      b_d = kv / (B * hbm_eff)
      Each decode step reads every cached K and V of the sequence once.
  decode per sequence
      c_d = 2 * P / (F * decode_mfu)
      The GEMM work for one more token in the batch.

With tensor parallelism over `tp` GPUs, W, the FLOPs and the KV reads split over tp devices and each
layer adds two all-reduces of the activations (ring: 2 (tp-1)/tp of the bytes over the GPU's NVLink:
3 on A100, 4 on H100/H200) plus a
fixed latency per all-reduce. tp must divide the query heads (vLLM refuses other degrees: "Total
number of attention heads must be divisible by tensor parallel size"). A KV head cannot be split:
with tp > kv_heads (grouped-query attention, e.g. Llama-3-8B's 8 KV heads on 16 GPUs) each GPU holds
a replica of one KV head (vLLM replicates them), so the group stores and reads tp / kv_heads times
the model's KV bytes per token (`kv_replication`).

Efficiencies (assumed, typical of vLLM on these parts): prefill MFU 0.55, attention 0.45 of peak,
decode MFU 0.5, 80% of peak HBM bandwidth, 1 ms overhead.

Sanity checks (computed by tests/serving/test_costmodel.py from these presets):
  - llama-3-8b@h100 batch-1 decode ~7 ms per token (~140 tokens/s);
  - llama-2-13b@a100 batch-1 decode ~17 ms per token, far inside DistServe's (OSDI'24, Table 1)
    0.1 s TPOT SLO for its 13B chatbot, and a 512-token prefill ~0.1 s, inside its 0.25 s TTFT SLO;
  - H200 decodes faster than H100 (more bandwidth) but prefills at the same per-token rate (same
    compute); A100 is the slowest in both.
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.costmodel.config import MODEL_CONFIGS, ModelConfig, get_model_config
from serving.costmodel.gpus import GPU_SPECS, GpuSpec, get_gpu
from serving.costmodel.model import CostModel, PhaseCoeffs
from serving.costmodel.transfer import Link, nvlink


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Achieved fractions of peak used by `derive_cost_model`.

    Attributes:
        prefill_mfu: Fraction of peak FLOP/s reached by prefill GEMMs.
        attention_eff: Fraction of peak FLOP/s reached by prefill attention.
        decode_mfu: Fraction of peak FLOP/s for the per-sequence decode GEMM work.
        hbm_eff: Fraction of peak HBM bandwidth reached by weight and KV reads.
        overhead_s: Fixed per-iteration cost (scheduling, sampling, launches).
        allreduce_latency_s: Fixed cost of one all-reduce (tensor parallelism only).
        weight_headroom: Fraction of device memory weights may take for a config to be offered.
    """

    prefill_mfu: float = 0.55
    attention_eff: float = 0.45
    decode_mfu: float = 0.5
    hbm_eff: float = 0.8
    overhead_s: float = 1e-3
    allreduce_latency_s: float = 10e-6
    weight_headroom: float = 0.8

    def __post_init__(self) -> None:
        for name in ("prefill_mfu", "attention_eff", "decode_mfu", "hbm_eff", "weight_headroom"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"{name}={value} must be in (0, 1]")
        if self.overhead_s < 0 or self.allreduce_latency_s < 0:
            raise ValueError("overhead_s and allreduce_latency_s must be >= 0")


DEFAULT_EFFICIENCY = Efficiency()


def fits(model: ModelConfig, gpu: GpuSpec, tp: int = 1, eff: Efficiency = DEFAULT_EFFICIENCY) -> bool:
    """Whether the weights take at most `weight_headroom` of the memory of `tp` GPUs."""
    return model.weight_bytes() <= eff.weight_headroom * gpu.memory_bytes * tp


def check_tp(model: ModelConfig, tp: int) -> None:
    """Raise ValueError unless `tp` is a tensor-parallel degree `model` can be sharded over."""
    if tp < 1:
        raise ValueError(f"{tp=} must be >= 1")
    if model.num_heads % tp:
        raise ValueError(f"{tp=} does not divide the {model.num_heads} attention heads of {model.name}")


def kv_replication(model: ModelConfig, tp: int) -> float:
    """Copies of each KV head a tp-GPU group stores: tp / kv_heads when tp > kv_heads, else 1."""
    return max(1.0, tp / model.num_kv_heads)


def derive_cost_model(
    model: ModelConfig,
    gpu: GpuSpec,
    tp: int = 1,
    eff: Efficiency = DEFAULT_EFFICIENCY,
    link: Link | None = None,
) -> CostModel:
    """A CostModel for `model` on `tp` GPUs of kind `gpu`, by the derivation in the module docstring.

    `link` carries the all-reduces; by default the GPU's NVLink (`transfer.nvlink`: NVLink 3 on
    the A100, which the presets once priced at the H100's NVLink 4 bandwidth).

    Raises:
        ValueError: tp < 1 or not a divisor of the heads, or the weights do not fit.
    """
    check_tp(model, tp)
    if not fits(model, gpu, tp, eff):
        raise ValueError(
            f"{model.name} weights ({model.weight_bytes() / 1e9:.1f} GB) do not fit on {tp} x {gpu.name}; "
            "raise tp"
        )
    flops = gpu.peak_flops * tp
    bw = gpu.hbm_bytes_per_s * eff.hbm_eff * tp
    a = model.weight_bytes() / bw + eff.overhead_s
    per_token_comm = 0.0
    if tp > 1:
        # two all-reduces per layer, each of H * dtype bytes per token, ring: 2 (tp-1)/tp of them
        a += 2 * model.num_layers * eff.allreduce_latency_s
        per_token_comm = (
            2 * model.num_layers * model.hidden_size * model.dtype_bytes * 2 * (tp - 1) / tp
        ) / (link or nvlink(gpu.name)).bandwidth_bytes_per_s
    prefill = PhaseCoeffs(
        a,
        2 * model.num_params / (flops * eff.prefill_mfu) + per_token_comm,
        2 * model.num_layers * model.hidden_size / (flops * eff.attention_eff),
    )
    decode = PhaseCoeffs(
        a,
        model.kv_bytes_per_token() * kv_replication(model, tp) / bw,
        2 * model.num_params / (flops * eff.decode_mfu) + per_token_comm,
    )
    label = f"{model.name}@{gpu.name}" + (f"x{tp}" if tp > 1 else "")
    return CostModel(prefill, decode, model.kv_bytes_per_token(), label)


def available_presets() -> list[tuple[str, str]]:
    """(model, gpu) pairs with a single-GPU preset, sorted."""
    return sorted((m, g) for m, mc in MODEL_CONFIGS.items() for g, gs in GPU_SPECS.items() if fits(mc, gs))


def get_preset(model: str, gpu: str, tp: int = 1) -> CostModel:
    """The derived cost model of `model` on `tp` x `gpu`.

    Raises:
        ValueError: Unknown model or gpu (listing the valid names), or weights that do not fit.
    """
    return derive_cost_model(get_model_config(model), get_gpu(gpu), tp)


def kv_capacity_tokens(
    model: str | ModelConfig, gpu: str | GpuSpec, tp: int = 1, mem_util: float = 0.9, pp: int = 1
) -> int:
    """KV tokens that fit beside the weights in `mem_util` of the memory of tp x pp GPUs (vLLM's
    gpu_memory_utilization; activations and CUDA graphs are ignored): pp pipeline stages, each
    sharded over tp GPUs. KV heads replicated over tp > kv_heads GPUs count once per replica.

    Raises:
        ValueError: Unknown model or gpu, mem_util outside (0, 1], tp not a divisor of the heads,
            or pp < 1.
    """
    mc = get_model_config(model) if isinstance(model, str) else model
    gs = get_gpu(gpu) if isinstance(gpu, str) else gpu
    if not 0 < mem_util <= 1:
        raise ValueError(f"{mem_util=} must be in (0, 1]")
    check_tp(mc, tp)
    if pp < 1:
        raise ValueError(f"{pp=} must be >= 1")
    free = gs.memory_bytes * tp * pp * mem_util - mc.weight_bytes()
    return max(0, int(free // (mc.kv_bytes_per_token() * kv_replication(mc, tp))))
