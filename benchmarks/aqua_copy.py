"""The aggregated KV copy's bandwidth against a plain memcpy of the same bytes (aqua_burst's
`copy_bandwidth_fraction`, target >= 0.8). Run through benchmarks/aqua_burst.py."""

from __future__ import annotations

import statistics
import time
from typing import Any


def copy_bandwidth(quick: bool) -> dict[str, Any]:
    """Aggregated gather (all layers' blocks of one request into one buffer) vs a plain memcpy.

    KV shaped like a Llama-3-8B layer (8 KV heads x 128 dims, fp16, 32-token blocks), 16 layers;
    a request of 32 scattered blocks (1,024 tokens) is gathered into one pre-touched buffer,
    against `copy_` of a contiguous tensor of the same bytes into another pre-touched buffer.
    """
    import torch

    from serving.aqua.offload.paged import PagedKV

    torch.manual_seed(0)
    n_layers, n_blocks, n_req = 16, 96, 32
    caches = [torch.randn(n_blocks, 2, 8, 32, 128).half() for _ in range(n_layers)]
    kv = PagedKV(caches, n_blocks)
    ids = torch.randperm(n_blocks)[:n_req].tolist()
    nbytes = kv.nbytes(n_req)
    dest = torch.ones(nbytes, dtype=torch.uint8)
    src = torch.ones(nbytes, dtype=torch.uint8)
    plain = torch.zeros(nbytes, dtype=torch.uint8)
    reps = 5 if quick else 21

    def gather() -> None:
        kv.gather(ids, dest)

    def memcpy() -> None:
        plain.copy_(src)

    # Interleaved, so that load from other processes drifting during the measurement hits both.
    times: dict[Any, list[float]] = {gather: [], memcpy: []}
    gather()
    memcpy()
    for _ in range(reps):
        for fn, ts in times.items():
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    t_gather, t_copy = statistics.median(times[gather]), statistics.median(times[memcpy])
    # Context: a memcpy with one thread, like the engine's worker (its process is bound to one
    # core on this machine); the headline fraction stays against torch's default threads.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    one: list[float] = []
    for _ in range(reps):
        t0 = time.perf_counter()
        memcpy()
        one.append(time.perf_counter() - t0)
    torch.set_num_threads(threads)
    t_copy_1 = statistics.median(one)
    # Correctness of what was timed: the buffer holds exactly the selected blocks.
    view = kv.as_blocks(dest, n_req)
    assert torch.equal(view[3], caches[3][ids]), "gather produced wrong data"
    return {
        "bytes": nbytes,
        "gather_s": t_gather,
        "memcpy_s": t_copy,
        "gather_gb_s": nbytes / t_gather / 1e9,
        "memcpy_gb_s": nbytes / t_copy / 1e9,
        "fraction": t_copy / t_gather,
        "memcpy_1thread_gb_s": nbytes / t_copy_1 / 1e9,
        "fraction_vs_1thread_memcpy": t_copy_1 / t_gather,
        "torch_threads": torch.get_num_threads(),
    }
