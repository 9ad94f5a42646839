"""CUDA IPC regions on a host without CUDA: import-safe, handle encoding, a clear refusal.

The GPU path itself is checked by scripts/gpu_smoke_aqua_ipc.py on an NVIDIA host.
"""

from __future__ import annotations

import json

import pytest
import torch

from serving.aqua.memory import RegionUnavailable, open_region
from serving.aqua.memory.cuda_ipc import CudaIpcRegion, decode_ipc_handle, encode_ipc_handle

# The shape of what UntypedStorage._share_cuda_() returns: device, IPC handle bytes, storage size
# and offset, ref-counter file name and offset, event handle, whether an event sync is needed.
SHARE = (0, b"\x00\xffipc-handle\x01" * 4, 1 << 20, 512, b"/torch_123_456", 7, b"\x10event", True)


def test_it_round_trips_the_ipc_export_through_json() -> None:
    data = json.loads(json.dumps(encode_ipc_handle(SHARE)))
    assert decode_ipc_handle(data) == SHARE


def test_it_keeps_absent_event_handles_absent() -> None:
    share = (*SHARE[:6], None, False)
    assert decode_ipc_handle(encode_ipc_handle(share)) == share


def test_it_rejects_truncated_exports_and_handles() -> None:
    with pytest.raises(ValueError, match="expected 8"):
        encode_ipc_handle(SHARE[:5])
    data = encode_ipc_handle(SHARE)
    del data["ref_counter_handle"]
    with pytest.raises(ValueError, match="ref_counter_handle"):
        decode_ipc_handle(data)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")
def test_it_refuses_cuda_handles_on_a_host_without_cuda() -> None:
    handle = {"kind": "cuda_ipc", "device": "cuda:0", "nbytes": 16, "pid": -1, "token": "t"}
    handle["ipc"] = encode_ipc_handle(SHARE)
    with pytest.raises(RegionUnavailable, match="CUDA"):
        open_region(handle)
    with pytest.raises(RegionUnavailable, match="CUDA"):
        CudaIpcRegion.create(16)


def test_it_rejects_handles_of_another_kind() -> None:
    with pytest.raises(ValueError, match="not a CUDA IPC handle"):
        CudaIpcRegion.attach({"kind": "shm", "name": "x"})


class _Stream:
    """Records which streams it was ordered after."""

    def __init__(self, device: object = None) -> None:
        self.device = device
        self.waited: list[str] = []

    def wait_stream(self, other: str) -> None:
        self.waited.append(other)

    def synchronize(self) -> None:
        pass


class _Tensor:
    """What `_copy` touches of a tensor."""

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"

    def numel(self) -> int:
        return 64

    def copy_(self, src: object, non_blocking: bool = False) -> None:
        pass

    def record_stream(self, stream: object) -> None:
        pass


def test_copies_wait_for_the_callers_stream_on_the_other_gpu_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # A consumer on cuda:0 writes its gathered KV into a peer's region on cuda:1: the side stream
    # (on cuda:1) waited only for cuda:1's current stream, not for cuda:0's, which was still
    # writing the gathered bytes.
    import contextlib

    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: f"current:{device}")
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    region = CudaIpcRegion(_Tensor("cuda:1"), "cuda:1", owner=False, handle={})  # type: ignore[arg-type]
    side = region._stream
    assert isinstance(side, _Stream)
    region._copy(_Tensor("cuda:1"), _Tensor("cuda:0"), sync=False)
    assert side.waited == ["current:cuda:1", "current:cuda:0"]
    side.waited.clear()
    # A read into host memory waits only for the region's GPU.
    region._copy(_Tensor("cpu"), _Tensor("cuda:1"), sync=True)
    assert side.waited == ["current:cuda:1"]
