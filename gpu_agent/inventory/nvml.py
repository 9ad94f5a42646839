"""NVIDIA GPUs through NVML (the `pynvml` module of nvidia-ml-py).

NVLink peers: for every active link of a GPU, NVML gives the PCI bus id of the remote end. If that
is another local GPU, the two are direct peers. If it is an NVSwitch (HGX boards: every GPU links
to the switches, not to each other), every GPU attached to a switch reaches every other one, so
they are all peers. Bus ids are compared after normalisation because NVML reports
"00000000:17:00.0" (8-digit domain) in some places and "0000:17:00.0" in others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple, TypeVar

from gpu_agent.inventory.base import Inventory
from gpu_agent.protocol import DeviceInfo, DeviceSample
from gpu_agent.schema import INT64_MAX

log = logging.getLogger(__name__)

T = TypeVar("T")


def normalize_bus_id(bus_id: str | bytes) -> str:
    """ "00000000:17:00.0" and "0000:17:00.0" -> "0000:17:00.0" (lower case, 4-digit domain)."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    text = text.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep:
        return text
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return text


def nvlink_peers(nvml: Any, handles: list[Any], bus_ids: list[str]) -> list[list[int]]:
    """For each of the given GPUs, the sorted positions of the given GPUs it reaches over NVLink.

    Args:
        nvml: The pynvml module (initialised).
        handles: Device handles of the local GPUs to consider.
        bus_ids: Their normalised PCI bus ids, in the same order.

    Returns:
        peers[i] = sorted positions j != i in `handles`; the relation is symmetric.
    """
    index_by_bus = {bus: i for i, bus in enumerate(bus_ids)}
    peers: list[set[int]] = [set() for _ in handles]
    on_switch: set[int] = set()
    for i, handle in enumerate(handles):
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError:
                break  # NOT_SUPPORTED (no NVLink) or INVALID_ARGUMENT (past the last link)
            if state != nvml.NVML_FEATURE_ENABLED:
                continue
            try:
                remote = normalize_bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except nvml.NVMLError:
                continue
            j = index_by_bus.get(remote)
            if j is not None:
                if j != i:
                    peers[i].add(j)
                    peers[j].add(i)
                continue
            remote_type = _maybe(nvml, nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
            if remote_type == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                on_switch.add(i)
    for i in on_switch:
        peers[i] |= on_switch - {i}
    return [sorted(p) for p in peers]


def _maybe(nvml: Any, fn: Callable[..., T], *args: Any) -> T | None:
    """fn(*args), or None when the device does not support the query."""
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


class _Gpu(NamedTuple):
    handle: Any
    bus_id: str  # normalised
    info: DeviceInfo


class NvmlInventory(Inventory):
    """Every GPU NVML sees, indexed as NVML (and CUDA with CUDA_DEVICE_ORDER=PCI_BUS_ID) orders them.

    A GPU NVML cannot read when the inventory is made (it fell off the bus before the agent
    started) is logged at ERROR and left out for the life of the agent: there is no UUID or memory
    size to register it with. A GPU in MIG mode is logged at WARNING and left out too: CUDA runs on
    its MIG instances, not on the GPU, so an engine started on it (CUDA_VISIBLE_DEVICES=<index>)
    finds no device. The others keep their NVML indices, which deployments name them by.

    A GPU whose driver does not report its memory (NOT_SUPPORTED: a unified-memory GPU, such as
    the GB10 of a DGX Spark, has none of its own) is registered with its memory unknown: 0 bytes
    total, and 0 used and 0 free in every sample, as the protocol reports memory it does not have;
    its utilisation, temperature and power are sampled as usual. Said once, at WARNING.
    """

    kind = "nvml"

    def __init__(self, nvml: Any) -> None:
        """Args: nvml: the pynvml module, already initialised with nvmlInit()."""
        self._nvml = nvml
        gpus = [g for i in range(nvml.nvmlDeviceGetCount()) if (g := self._read(i)) is not None]
        peers = nvlink_peers(nvml, [g.handle for g in gpus], [g.bus_id for g in gpus])  # positions
        self._handles = {g.info.index: g.handle for g in gpus}  # NVML index -> handle
        self._devices = {
            g.info.index: replace(g.info, nvlink_peers=[gpus[j].info.index for j in p])
            for g, p in zip(gpus, peers, strict=True)
        }
        self._unreadable: set[int] = set()  # indices of GPUs whose last sample failed

    def _read(self, i: int) -> _Gpu | None:
        """GPU i as NVML describes it (no peers yet); None, logged, if NVML cannot read it."""
        nvml = self._nvml
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            bus_id = normalize_bus_id(nvml.nvmlDeviceGetPciInfo(h).busId)
            uuid, name = _text(nvml.nvmlDeviceGetUUID(h)), _text(nvml.nvmlDeviceGetName(h))
            if _mig_enabled(nvml, h):
                log.warning(
                    "GPU %d (%s, %s) is in MIG mode; it is left out until the agent restarts: engines"
                    " run on a whole GPU, and CUDA sees only the MIG instances of this one (disable"
                    " MIG with `nvidia-smi -i %d -mig 0` to use it).",
                    i,
                    uuid,
                    name,
                    i,
                )
                return None
            mem = _memory_info(nvml, h)
            if mem is None:
                log.warning(
                    "GPU %d (%s, %s) does not report its memory (a unified-memory GPU shares the"
                    " host's); it is registered with its memory unknown (0 bytes), which placement"
                    " leaves alone.",
                    i,
                    uuid,
                    name,
                )
            info = DeviceInfo(
                index=i,
                uuid=uuid,
                name=name,
                kind="gpu",
                memory_total_bytes=0 if mem is None else _bytes(mem.total),
            )
        except nvml.NVMLError as exc:
            log.error("GPU %d cannot be read (%s); it is left out until the agent restarts.", i, exc)
            return None
        return _Gpu(h, bus_id, info)

    def describe(self) -> list[DeviceInfo]:
        return list(self._devices.values())

    def sample(self) -> list[DeviceSample]:
        """Each GPU now. A GPU NVML cannot read (it fell off the bus: GPU_IS_LOST, UNKNOWN) is
        reported with no memory, utilisation, temperature or power and logged once at ERROR; the
        other GPUs report as usual, and the lost one again when NVML reads it again."""
        out = []
        for i, h in self._handles.items():
            try:
                out.append(self._sample(i, h))
            except self._nvml.NVMLError as exc:
                if i not in self._unreadable:
                    self._unreadable.add(i)
                    log.error("GPU %d (%s) cannot be read: %s", i, self._devices[i].uuid, exc)
                out.append(DeviceSample(index=i, memory_used_bytes=0, memory_free_bytes=0))
            else:
                if i in self._unreadable:
                    self._unreadable.discard(i)
                    log.warning("GPU %d (%s) can be read again.", i, self._devices[i].uuid)
        return out

    def _sample(self, i: int, h: Any) -> DeviceSample:
        nvml = self._nvml
        mem = _memory_info(nvml, h)
        util = _maybe(nvml, nvml.nvmlDeviceGetUtilizationRates, h)
        temp = _maybe(nvml, nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
        milliwatts = _maybe(nvml, nvml.nvmlDeviceGetPowerUsage, h)
        return DeviceSample(
            index=i,
            memory_used_bytes=0 if mem is None else _bytes(mem.used),
            memory_free_bytes=0 if mem is None else _bytes(mem.free),
            utilization_pct=None if util is None else float(min(100, util.gpu)),
            temperature_c=None if temp is None else float(temp),
            power_w=None if milliwatts is None else milliwatts / 1000.0,
        )

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            log.debug("nvmlShutdown failed: %s", exc)


def _memory_info(nvml: Any, handle: Any) -> Any:
    """nvmlDeviceGetMemoryInfo(handle), or None when the GPU does not report its memory
    (NOT_SUPPORTED: a unified-memory GPU); any other NVML error is raised."""
    try:
        return nvml.nvmlDeviceGetMemoryInfo(handle)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED:
            return None
        raise


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    """Whether the GPU's current MIG mode is enabled; False where it has no MIG (NOT_SUPPORTED),
    NVML cannot tell, or the nvidia-ml-py is older than MIG."""
    get_mode = getattr(nvml, "nvmlDeviceGetMigMode", None)
    mode = None if get_mode is None else _maybe(nvml, get_mode, handle)
    return mode is not None and mode[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)


def _bytes(value: int) -> int:
    """A byte count NVML reported, or 0 where it cannot be one.

    NVML's counts are unsigned 64-bit. An inconsistent reading (used beyond total, or a total of
    0) makes a count that was subtracted past zero wrap to nearly 2**64: no real count, and past
    the signed 64-bit range the control plane stores, which refuses the whole telemetry frame over
    it (every device and engine of the host, every tick). Such a count means "none"; the device's
    other readings, and the other devices, are reported as usual.
    """
    value = int(value)
    return value if 0 <= value <= INT64_MAX else 0


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
