"""`CudaIpcRegion`: a CUDA buffer on a producer's GPU, shared with a consumer through CUDA IPC.

The producer allocates `torch.empty(nbytes, dtype=uint8, device="cuda:i")` and exports it with
torch's own CUDA IPC path (`UntypedStorage._share_cuda_()`, the one torch.multiprocessing uses,
with its cross-process reference counter). The export is encoded into the JSON-able handle
(`encode_ipc_handle`); a consumer rebuilds the storage with `UntypedStorage._new_shared_cuda`
(`decode_ipc_handle` + `attach`), which opens the memory with cudaIpcOpenMemHandle and lazily
enables peer access, so NVLink peers read and write it directly.

GPUs are matched by UUID, not index: engine processes usually see different
CUDA_VISIBLE_DEVICES. If the producer's GPU is invisible to the consumer, the buffer is opened on
the consumer's current device (peer access). Copies run on a side stream, ordered after the
caller's current stream, and are synchronised before returning unless `sync=False`.

Consumers `close()` a region once they hold no allocation in it; the producer frees the buffer
only after its reclaim is done (the protocol guarantees no consumer still uses it).
Importing this module needs no GPU; only `create` and `attach` do.
"""

from __future__ import annotations

import base64
import os
import secrets
from typing import Any

import torch

from serving.aqua.memory.base import Buffer, Region, RegionUnavailable

# token -> tensor, for buffers exported by this process: CUDA cannot IPC-open memory in the
# process that exported it, so a same-process attach aliases the tensor instead.
_LOCAL_EXPORTS: dict[str, torch.Tensor] = {}
_IPC_FIELDS = (
    "storage_device",
    "storage_handle",
    "storage_size_bytes",
    "storage_offset_bytes",
    "ref_counter_handle",
    "ref_counter_offset",
    "event_handle",
    "event_sync_required",
)
_BYTES_FIELDS = {"storage_handle", "ref_counter_handle", "event_handle"}


def encode_ipc_handle(share: tuple[Any, ...]) -> dict[str, Any]:
    """The tuple `UntypedStorage._share_cuda_()` returns, as a JSON-able dict (bytes in base64)."""
    if len(share) != len(_IPC_FIELDS):
        raise ValueError(f"expected {len(_IPC_FIELDS)} fields from _share_cuda_, got {len(share)}")
    out: dict[str, Any] = {}
    for key, value in zip(_IPC_FIELDS, share, strict=True):
        if key in _BYTES_FIELDS:
            out[key] = None if value is None else base64.b64encode(bytes(value)).decode("ascii")
        elif key == "event_sync_required":
            out[key] = bool(value)
        else:
            out[key] = int(value)
    return out


def decode_ipc_handle(data: dict[str, Any]) -> tuple[Any, ...]:
    """Inverse of `encode_ipc_handle`: the arguments of `UntypedStorage._new_shared_cuda`."""
    missing = [k for k in _IPC_FIELDS if k not in data]
    if missing:
        raise ValueError(f"CUDA IPC handle lacks {missing}")
    return tuple(
        (None if data[k] is None else base64.b64decode(data[k])) if k in _BYTES_FIELDS else data[k]
        for k in _IPC_FIELDS
    )


class CudaIpcRegion(Region):
    """`nbytes` of one GPU's memory; created by the producer, attached by a consumer."""

    kind = "cuda_ipc"

    def __init__(self, buf: torch.Tensor, device: str, *, owner: bool, handle: dict[str, Any]) -> None:
        super().__init__(buf.numel(), device, owner=owner)
        self._buf: torch.Tensor | None = buf
        self._handle = handle
        self._stream = torch.cuda.Stream(device=buf.device)

    @classmethod
    def create(cls, nbytes: int, device_index: int = 0) -> CudaIpcRegion:
        """Allocate `nbytes` on cuda:`device_index` and export it (the producer side)."""
        _require_cuda()
        buf = torch.zeros(nbytes, dtype=torch.uint8, device=f"cuda:{device_index}")
        token = secrets.token_hex(8)
        handle = {
            "kind": cls.kind,
            "device": f"cuda:{device_index}",
            "device_uuid": _device_uuid(device_index),
            "nbytes": nbytes,
            "pid": os.getpid(),
            "token": token,
            "ipc": encode_ipc_handle(buf.untyped_storage()._share_cuda_()),
        }
        _LOCAL_EXPORTS[token] = buf
        return cls(buf, f"cuda:{device_index}", owner=True, handle=handle)

    @classmethod
    def attach(cls, handle: dict[str, Any]) -> CudaIpcRegion:
        """Open a producer's exported buffer (the consumer side)."""
        if handle.get("kind") != cls.kind or not isinstance(handle.get("ipc"), dict):
            raise ValueError(f"not a CUDA IPC handle: {handle!r}")
        local = _LOCAL_EXPORTS.get(str(handle.get("token")))
        if local is not None and handle.get("pid") == os.getpid():
            return cls(local, str(handle["device"]), owner=False, handle=handle)
        _require_cuda()
        index = _local_index(handle.get("device_uuid"))
        args = list(decode_ipc_handle(handle["ipc"]))
        args[0] = index  # the storage's device in THIS process's numbering
        torch.cuda._lazy_init()
        try:
            storage = torch.UntypedStorage._new_shared_cuda(*args)
        except RuntimeError as exc:
            raise RegionUnavailable(f"cannot open CUDA IPC buffer of pid {handle.get('pid')}: {exc}") from exc
        buf = torch.empty(0, dtype=torch.uint8, device=f"cuda:{index}")
        buf.set_(storage, 0, (int(handle["nbytes"]),), (1,))
        return cls(buf, str(handle["device"]), owner=False, handle=handle)

    def handle(self) -> dict[str, Any]:
        return dict(self._handle)

    def tensor(self, offset: int, nbytes: int) -> torch.Tensor:
        self._check(offset, nbytes)
        assert self._buf is not None
        return self._buf[offset : offset + nbytes]

    def write(self, offset: int, data: Buffer, *, sync: bool = True) -> None:
        """Copy `data` (a tensor on any device, or host bytes) into the buffer on the side stream."""
        src = _as_uint8(data)
        self._copy(self.tensor(offset, src.numel()), src, sync)

    def read_into(self, offset: int, out: Buffer, *, sync: bool = True) -> None:
        """Copy bytes at `offset` into `out` (a contiguous tensor, or a writable host buffer)."""
        if isinstance(out, torch.Tensor):
            if not out.is_contiguous():
                raise ValueError("read_into needs a contiguous output tensor")
            dst = out.view(-1).view(torch.uint8)
            self._copy(dst, self.tensor(offset, dst.numel()), sync)
            return
        host = torch.frombuffer(out, dtype=torch.uint8)
        self._copy(host, self.tensor(offset, host.numel()), sync=True)

    def synchronize(self) -> None:
        """Wait for every copy queued on this region's side stream."""
        self._stream.synchronize()

    def _copy(self, dst: torch.Tensor, src: torch.Tensor, sync: bool) -> None:
        # Order after work already queued on the caller's streams: the one that produced `src` and
        # the one that last used `dst`. Either may be on another GPU than this region (a consumer
        # copying its KV to a peer's lent buffer), so wait on the current stream of each tensor's
        # device, not only the region's. Then keep both tensors' memory alive until the side
        # stream has used it.
        for device in dict.fromkeys(t.device for t in (dst, src) if t.is_cuda):
            self._stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(self._stream):
            dst.copy_(src, non_blocking=True)
        for t in (dst, src):
            if t.is_cuda:
                t.record_stream(self._stream)
        if sync:
            self._stream.synchronize()

    def close(self) -> None:
        """Drop this process's reference; the owner's buffer returns to torch's allocator."""
        if self.closed:
            return
        self.closed = True
        self._stream.synchronize()
        self._buf = None
        if self.owner:
            _LOCAL_EXPORTS.pop(str(self._handle.get("token")), None)
        torch.cuda.ipc_collect()


def _require_cuda() -> None:
    if not torch.cuda.is_available():
        raise RegionUnavailable("CUDA IPC regions need a CUDA device; none is available here")


def _device_uuid(index: int) -> str | None:
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return None if uuid is None else str(uuid)


def _local_index(uuid: object) -> int:
    """This process's index of the GPU with `uuid`, else its current device (peer access)."""
    if uuid is not None:
        for i in range(torch.cuda.device_count()):
            if _device_uuid(i) == uuid:
                return i
    return torch.cuda.current_device()


def _as_uint8(data: Buffer) -> torch.Tensor:
    if isinstance(data, torch.Tensor):
        return data.detach().contiguous().view(-1).view(torch.uint8)
    return torch.frombuffer(bytearray(memoryview(data).cast("B")), dtype=torch.uint8)
