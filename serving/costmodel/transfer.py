"""Cost of moving bytes over a link: bytes / bandwidth + fixed latency.

Defaults: NVLink 4 at 450 GB/s per direction (H100/H200 SXM: 900 GB/s bidirectional, NVIDIA H100
datasheet); NVLink 3 at 300 GB/s per direction (A100 SXM4: 600 GB/s bidirectional, NVIDIA A100
datasheet); PCIe Gen5 x16 at 64 GB/s per direction (PCI-SIG: 32 GT/s x 16 lanes, 128b/130b);
host memcpy at 20 GB/s (a single-threaded DRAM-to-DRAM copy on a server CPU; measure yours with
benchmarks/aqua_burst.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.costmodel.config import ModelConfig
from serving.costmodel.model import CostModel


@dataclass(frozen=True, slots=True)
class Link:
    """A one-directional data path.

    Attributes:
        name: Label, e.g. "nvlink4".
        bandwidth_bytes_per_s: Sustained bandwidth in one direction.
        latency_s: Fixed cost per transfer (launch + first byte).
    """

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if self.bandwidth_bytes_per_s <= 0:
            raise ValueError(f"{self.bandwidth_bytes_per_s=} must be positive")
        if self.latency_s < 0:
            raise ValueError(f"{self.latency_s=} must be >= 0")

    def seconds(self, nbytes: int) -> float:
        """Time to move `nbytes` in one transfer (0 bytes cost nothing)."""
        if nbytes <= 0:
            return 0.0
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s


NVLINK4 = Link("nvlink4", 450e9, 5e-6)
NVLINK3 = Link("nvlink3", 300e9, 5e-6)
# gpu name -> the NVLink between two such GPUs of one node
_NVLINK: dict[str, Link] = {"a100": NVLINK3, "h100": NVLINK4, "h200": NVLINK4}


def nvlink(gpu: str) -> Link:
    """The NVLink between two GPUs called `gpu` (serving/costmodel/gpus.py) in one node; NVLink 4
    for a GPU this table does not know."""
    return _NVLINK.get(gpu, NVLINK4)


PCIE5_X16 = Link("pcie5-x16", 64e9, 10e-6)
HOST_MEMCPY = Link("host-memcpy", 20e9, 1e-6)


def kv_bytes(num_tokens: int, model: ModelConfig | CostModel) -> int:
    """KV-cache bytes of `num_tokens` tokens of `model` (a ModelConfig or a CostModel)."""
    if num_tokens < 0:
        raise ValueError(f"{num_tokens=} must be >= 0")
    per_token = model.kv_bytes_per_token if isinstance(model, CostModel) else model.kv_bytes_per_token()
    return num_tokens * per_token


def kv_transfer_seconds(num_tokens: int, model: ModelConfig | CostModel, link: Link) -> float:
    """Seconds to move the KV cache of `num_tokens` tokens over `link` in one transfer."""
    return link.seconds(kv_bytes(num_tokens, model))
