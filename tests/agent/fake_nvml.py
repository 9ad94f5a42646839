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


class FakeNvml:
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_NVLINK_DEVICE_TYPE_GPU = 0
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_INVALID_ARGUMENT = 2
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

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
        return SimpleNamespace(busId=h.bus_id)

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return f"GPU-{h.bus_id}"

    def nvmlDeviceGetName(self, h: FakeGpu) -> bytes:
        return h.name.encode()

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        return SimpleNamespace(total=h.total, used=h.used, free=h.total - h.used)

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        if h.util is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=h.util, memory=0)

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        return h.temp

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return h.milliwatts

    def _link(self, h: FakeGpu, link: int) -> tuple[str, int]:
        if h.links is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(h.links):
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return h.links[link]

    def nvmlDeviceGetNvLinkState(self, h: FakeGpu, link: int) -> int:
        bus, _ = self._link(h, link)
        return 0 if bus == "down" else 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: FakeGpu, link: int) -> Any:
        return SimpleNamespace(busId=self._link(h, link)[0])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: FakeGpu, link: int) -> int:
        return self._link(h, link)[1]
