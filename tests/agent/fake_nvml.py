"""A stand-in for the pynvml module, for unit tests of the inventory's mapping logic only."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(f"NVML error {value}")


@dataclass
class FakeGpu:
    bus_id: str
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = 80 * 2**30
    used: int = 2**30
    util: int | None = 40
    temp: int = 50
    milliwatts: int = 250_000
    # link index -> (remote bus id, remote device type); missing NVLink support when None
    links: list[tuple[str, int]] | None = field(default_factory=list)
    # current MIG mode (1: enabled; its compute instances, not the GPU, run CUDA); None: no MIG support
    mig: int | None = None
    # NVML call name -> the error code it raises for this GPU (15: GPU_IS_LOST, 999: UNKNOWN)
    errors: dict[str, int] = field(default_factory=dict)


class FakeNvml:
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_NVLINK_DEVICE_TYPE_GPU = 0
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_INVALID_ARGUMENT = 2
    NVML_DEVICE_MIG_ENABLE = 1
    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def _query(self, call: str, h: FakeGpu) -> None:
        """Raise the error `h` is set to raise from `call`, if any."""
        if call in h.errors:
            raise NVMLError(h.errors[call])

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        self._query("nvmlDeviceGetHandleByIndex", self.gpus[i])
        return self.gpus[i]

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
        self._query("nvmlDeviceGetPciInfo", h)
        return SimpleNamespace(busId=h.bus_id)

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        self._query("nvmlDeviceGetUUID", h)
        return f"GPU-{h.bus_id}"

    def nvmlDeviceGetName(self, h: FakeGpu) -> bytes:
        self._query("nvmlDeviceGetName", h)
        return h.name.encode()

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        self._query("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(total=h.total, used=h.used, free=h.total - h.used)

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> list[int]:
        self._query("nvmlDeviceGetMigMode", h)
        if h.mig is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return [h.mig, h.mig]  # [current, pending]

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        self._query("nvmlDeviceGetUtilizationRates", h)
        if h.util is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=h.util, memory=0)

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        self._query("nvmlDeviceGetTemperature", h)
        return h.temp

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        self._query("nvmlDeviceGetPowerUsage", h)
        return h.milliwatts

    def _link(self, h: FakeGpu, link: int) -> tuple[str, int]:
        if h.links is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(h.links):
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return h.links[link]

    def nvmlDeviceGetNvLinkState(self, h: FakeGpu, link: int) -> int:
        self._query("nvmlDeviceGetNvLinkState", h)
        bus, _ = self._link(h, link)
        return 0 if bus == "down" else 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: FakeGpu, link: int) -> Any:
        self._query("nvmlDeviceGetNvLinkRemotePciInfo", h)
        return SimpleNamespace(busId=self._link(h, link)[0])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: FakeGpu, link: int) -> int:
        self._query("nvmlDeviceGetNvLinkRemoteDeviceType", h)
        return self._link(h, link)[1]
