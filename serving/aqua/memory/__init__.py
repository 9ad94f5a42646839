"""Memory behind Aqua regions.

- `Region` (base.py): handle / view / tensor / write / read_into / close.
- `ShmRegion`: POSIX shared memory created and owned by a producer; consumers attach by name.
- `CudaIpcRegion` (cuda_ipc.py, import it explicitly): a producer GPU buffer shared by CUDA IPC.
- `DramBuffer` (dram.py, import it explicitly): the consumer's own (pinned) host memory.
- `open_region(handle)`: attach whatever a producer leased, by the handle's "kind".

torch is imported only by the modules that need it (dram, cuda_ipc, and `Region.tensor`).
"""

from __future__ import annotations

from serving.aqua.memory.base import HostRegion, Region, RegionUnavailable
from serving.aqua.memory.registry import open_region, register_region_kind
from serving.aqua.memory.shm import ShmRegion

__all__ = ["HostRegion", "Region", "RegionUnavailable", "ShmRegion", "open_region", "register_region_kind"]
