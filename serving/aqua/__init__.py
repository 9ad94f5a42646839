"""Aqua (ASPLOS'25): lend idle GPU memory from producer models to consumer LLMs' KV cache.

- `serving.aqua.coordinator`: the per-host coordinator (state machine `Coordinator`, Unix-socket
  `CoordinatorServer`) and aqua-lib's client `AquaClient` (lease / resize / unlease /
  request_reclaim / reclaim_status for producers; allocate / free / pending_reclaims for consumers).
- `serving.aqua.memory`: the memory behind a region: `ShmRegion` (POSIX shared memory owned by the
  producer's process), `CudaIpcRegion` (a CUDA buffer shared through CUDA IPC), `DramBuffer`
  (the consumer's own host memory, the fallback), and `open_region(handle)` for consumers.
- `serving.aqua.producer`: a lender process (`python -m serving.aqua.producer`) for tests and demos.
"""
