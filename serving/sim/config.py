"""Engine configuration: the vLLM V1 scheduler knobs the simulator mirrors."""

from __future__ import annotations

from dataclasses import dataclass

PREEMPTION_MODES = ("recompute", "offload_dram", "offload_peer")
SCHEDULERS = ("v1", "v0")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Limits of one engine (one GPU, or one tensor-parallel group of GPUs).

    Attributes:
        max_num_batched_tokens: Token budget of one iteration: prefill-chunk tokens plus one token
            per decoding request (vLLM's `max_num_batched_tokens`).
        max_num_seqs: Max number of running requests (vLLM's `max_num_seqs`).
        block_size: Tokens per KV-cache block (vLLM's `block_size`).
        num_kv_blocks: KV-cache capacity in blocks.
        preemption_mode: What happens to a preempted request's KV: "recompute" (dropped and
            prefilled again on re-admission, vLLM's default), "offload_dram" (saved to host DRAM
            over PCIe and restored) or "offload_peer" (saved over NVLink into memory a paired GPU
            lends, falling back to DRAM when that is full or reclaimed).
        peer_capacity_bytes: Bytes of lent peer memory available at start (offload_peer only).
        fast_forward: Run several identical decode-only iterations in one step when the policy
            declares its decisions invariant over them (`decode_invariant`); the result is exactly
            the same as stepping one iteration at a time.
        scheduler: "v1" (vLLM V1: chunked prefill, decodes first, prompts fill the rest of the
            budget) or "v0" (paper-era vLLM V0: whole prompts in prefill-only iterations that stall
            decodes, admission above a 1% free-block watermark; see serving/sim/v0.py).
        v0_pad_prompts: (v0 only) Pad a prompt batch to its longest prompt, as vLLM v0.2's model
            runner did: the batch costs len(batch) prompts of the longest length, and its padded
            size len(batch) x longest must fit `max_num_batched_tokens`.
        v0_max_paddings: (v0 with padding only) Max padding tokens in one prompt batch (vLLM
            v0.2's `max_paddings`, 256 by default there); None for no limit.
    """

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    block_size: int = 16
    num_kv_blocks: int = 8192
    preemption_mode: str = "recompute"
    peer_capacity_bytes: int = 0
    fast_forward: bool = True
    scheduler: str = "v1"
    v0_pad_prompts: bool = False
    v0_max_paddings: int | None = None

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"{self.max_num_batched_tokens=} must be positive")
        if self.max_num_seqs < 1:
            raise ValueError(f"{self.max_num_seqs=} must be positive")
        if self.block_size < 1:
            raise ValueError(f"{self.block_size=} must be positive")
        if self.num_kv_blocks < 1:
            raise ValueError(f"{self.num_kv_blocks=} must be positive")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"{self.preemption_mode=} is not one of {', '.join(PREEMPTION_MODES)}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"{self.scheduler=} is not one of {', '.join(SCHEDULERS)}")
        if self.scheduler == "v0" and self.preemption_mode != "recompute":
            raise ValueError(f"{self.scheduler=} supports only preemption_mode='recompute'")
        if self.v0_pad_prompts and self.scheduler != "v0":
            raise ValueError(f"{self.v0_pad_prompts=} needs scheduler='v0'")
        if self.v0_max_paddings is not None and not self.v0_pad_prompts:
            raise ValueError(f"{self.v0_max_paddings=} needs v0_pad_prompts=True")
        if self.v0_max_paddings is not None and self.v0_max_paddings < 0:
            raise ValueError(f"{self.v0_max_paddings=} must be >= 0")
        if self.peer_capacity_bytes < 0:
            raise ValueError(f"{self.peer_capacity_bytes=} must be >= 0")
        if self.peer_capacity_bytes and self.preemption_mode != "offload_peer":
            raise ValueError(f"{self.peer_capacity_bytes=} needs preemption_mode='offload_peer'")

    @property
    def capacity_tokens(self) -> int:
        """KV capacity in tokens."""
        return self.num_kv_blocks * self.block_size
