"""TP/PP latency model of one DistServe instance, built on the cost-model presets.

An instance runs the model on tp x pp GPUs: pp pipeline stages of num_layers / pp layers each, every
stage sharded over tp GPUs (tensor parallelism inside a node). DistServe (OSDI'24, Sec. 3.1-3.2)
analyses the two kinds of parallelism as follows, and so does this model:

Intra-op (TP) divides each layer's weights, FLOPs and KV reads over tp GPUs and adds two
    all-reduces of the activations per layer; `derive_cost_model(model, gpu, tp)` already has that
    form (serving/costmodel/presets.py): a = W / (tp B) + overhead + 2 L all-reduce latencies,
    per-token terms divided by tp plus the all-reduce bytes over NVLink. It cuts the latency of
    every batch, with diminishing returns (the fixed terms stay).
Inter-op (PP) splits the layers: one stage costs what a model of L / pp layers and P / pp
    parameters costs on tp GPUs; a batch passes all pp stages in turn, handing its activations (H x
    dtype bytes per token) to the next stage over `stage_link`. A batch's latency is therefore
    pp x stage time + (pp - 1) hops, about the TP-only latency, but pp batches are in flight at
    once (one per stage). The simulator models a PP instance as pp LANES: each lane serves its
    own batches with the full pipeline latency and holds 1 / pp of the instance's KV cache; the
    instance's requests are spread round-robin over its lanes. Pipeline bubbles from uneven
    micro-batches are not modelled (lanes never wait for one another), which favours PP slightly.
KV capacity: `kv_capacity_tokens` over all tp x pp GPUs (90% of memory minus the weights; KV heads
replicated when tp exceeds them). tp must divide the model's attention heads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from serving.costmodel import CostModel, Link, PhaseCoeffs, get_gpu, get_model_config, kv_capacity_tokens
from serving.costmodel.presets import derive_cost_model, fits
from serving.costmodel.transfer import NVLINK3, nvlink

__all__ = [
    "IB_HDR",
    "NVLINK3",
    "LaneModel",
    "Parallelism",
    "feasible",
    "infeasibility",
    "lane_model",
    "nvlink",
]

# InfiniBand HDR: 200 Gb/s = 25 GB/s per NIC and direction (one NIC per GPU pair on DGX A100).
IB_HDR = Link("ib-hdr200", 25e9, 5e-6)


@dataclass(frozen=True, slots=True)
class Parallelism:
    """Tensor- and pipeline-parallel degrees of one instance.

    Attributes:
        tp: GPUs each stage is sharded over (inside one node).
        pp: Pipeline stages.
    """

    tp: int
    pp: int

    def __post_init__(self) -> None:
        if self.tp < 1 or self.pp < 1:
            raise ValueError(f"{self.tp=} and {self.pp=} must be >= 1")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp


@dataclass(frozen=True, slots=True)
class LaneModel:
    """What the simulator needs to run one instance as `lanes` pipelined lanes.

    Attributes:
        cost: Latency of one batch through the whole pipeline (all stages and hops).
        lanes: Batches in flight at once (= pp).
        kv_tokens_per_lane: KV capacity of one lane in tokens.
    """

    cost: CostModel
    lanes: int
    kv_tokens_per_lane: int


def infeasibility(model: str, gpu: str, par: Parallelism) -> str | None:
    """Why an instance of `par` cannot run `model` on `gpu` GPUs, or None when it can."""
    mc = get_model_config(model)
    if mc.num_heads % par.tp:
        return f"tp {par.tp} does not divide its {mc.num_heads} attention heads"
    if mc.num_layers % par.pp:
        return f"pp {par.pp} does not divide its {mc.num_layers} layers into equal stages"
    stage = replace(mc, num_layers=mc.num_layers // par.pp, num_params=mc.num_params // par.pp)
    if not fits(stage, get_gpu(gpu), par.tp):
        return f"a stage's weights ({stage.weight_bytes() / 1e9:.1f} GB) do not fit {par.tp} GPU(s)"
    if kv_capacity_tokens(model, gpu, par.tp, pp=par.pp) <= 0:
        return "no memory is left for the KV cache beside the weights"
    return None


def feasible(model: str, gpu: str, par: Parallelism) -> bool:
    """Whether tp divides the heads, the layers split evenly into pp stages, a stage's weights fit
    its tp GPUs and KV has room beside them."""
    return infeasibility(model, gpu, par) is None


def lane_model(model: str, gpu: str, par: Parallelism, stage_link: Link | None = None) -> LaneModel:
    """The lane cost model and KV split of an instance with parallelism `par`.

    Args:
        stage_link: Link between pipeline stages; by default the GPU's NVLink (`nvlink`).

    Raises:
        ValueError: The configuration is not `feasible`.
    """
    why = infeasibility(model, gpu, par)
    if why is not None:
        raise ValueError(f"{model} on {par.tp} x {par.pp} {gpu} GPUs is not feasible: {why}")
    if stage_link is None:
        stage_link = nvlink(gpu)
    mc = get_model_config(model)
    stage = replace(mc, num_layers=mc.num_layers // par.pp, num_params=mc.num_params // par.pp)
    sc = derive_cost_model(stage, get_gpu(gpu), par.tp)  # all-reduces over the GPU's NVLink
    hops = par.pp - 1
    hop_token = mc.hidden_size * mc.dtype_bytes / stage_link.bandwidth_bytes_per_s
    pp = par.pp
    hop_a = hops * stage_link.latency_s
    p, d = sc.prefill, sc.decode
    prefill = PhaseCoeffs(pp * p.a + hop_a, pp * p.b + hops * hop_token, pp * p.c)
    decode = PhaseCoeffs(pp * d.a + hop_a, pp * d.b, pp * d.c + hops * hop_token)
    cost = CostModel(prefill, decode, mc.kv_bytes_per_token(), f"{model}@{gpu}/tp{par.tp}pp{par.pp}")
    return LaneModel(cost, pp, kv_capacity_tokens(model, gpu, par.tp, pp=par.pp) // pp)
