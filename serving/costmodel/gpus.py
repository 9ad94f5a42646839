"""Accelerator figures used to derive cost-model presets (vendor datasheets, SXM parts).

h100  NVIDIA H100 SXM5 80GB: 989 TFLOPS dense BF16 tensor, 3.35 TB/s HBM3.
h200  NVIDIA H200 SXM 141GB: same compute as H100 (989 TFLOPS dense BF16), 4.8 TB/s HBM3e.
a100  NVIDIA A100 SXM4 80GB: 312 TFLOPS dense BF16 tensor, 2.039 TB/s HBM2e.
Memory is the usable size nvidia-smi reports: 81,559 MiB (H100), 143,771 MiB (H200), 81,920 MiB
(A100 80GB).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Peak figures of one accelerator.

    Attributes:
        name: Registry key, e.g. "h100".
        peak_flops: Dense BF16/FP16 tensor throughput (FLOP/s).
        hbm_bytes_per_s: Memory bandwidth (bytes/s).
        memory_bytes: Device memory (bytes).
    """

    name: str
    peak_flops: float
    hbm_bytes_per_s: float
    memory_bytes: int

    def __post_init__(self) -> None:
        if not self.peak_flops > 0:
            raise ValueError(f"{self.peak_flops=} must be positive")
        if not self.hbm_bytes_per_s > 0:
            raise ValueError(f"{self.hbm_bytes_per_s=} must be positive")
        if self.memory_bytes <= 0:
            raise ValueError(f"{self.memory_bytes=} must be positive")


MIB = 1 << 20
# name -> spec
GPU_SPECS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("h100", 989e12, 3.35e12, 81_559 * MIB),
        GpuSpec("h200", 989e12, 4.8e12, 143_771 * MIB),
        GpuSpec("a100", 312e12, 2.039e12, 81_920 * MIB),
    )
}


def get_gpu(name: str) -> GpuSpec:
    """The spec called `name`.

    Raises:
        ValueError: Unknown name; the message lists the known ones.
    """
    try:
        return GPU_SPECS[name]
    except KeyError:
        raise ValueError(f"unknown gpu {name!r}; choose one of: {', '.join(sorted(GPU_SPECS))}") from None
