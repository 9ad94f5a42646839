"""Per-device lending figures for regions lent by the producer CLI (`python -m serving.aqua.producer`),
whose default device is "cpu0" and whose producer id is not a deployment of the agent."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_agent.aqua import AquaDeviceState, device_states


def _region(device: str, consumer_id: str | None, allocated: int, producer_id: str = "producer-42") -> Any:
    return {
        "region_id": "r1",
        "producer_id": producer_id,
        "device": device,
        "nbytes": 8 << 20,
        "allocated_bytes": allocated,
        "consumer_id": consumer_id,
    }


@pytest.mark.parametrize("device", ["cpu0", "cpu", "CPU0", "cpu:0"])
def test_it_reports_a_shared_memory_region_of_the_producer_cli_as_lent_by_the_cpu(device: str) -> None:
    states = device_states({"regions": [_region(device, None, 0)]}, {}, host_memory_device=0)
    assert states == {0: AquaDeviceState("producer", lent_bytes=8 << 20, borrowed_bytes=0, paired_with=None)}


def test_it_reports_the_consumer_of_a_cpu0_region_as_borrowing() -> None:
    # The local host: the producer CLI lends cpu0, deployment "1" on device 0 borrows 4 MiB of it.
    states = device_states({"regions": [_region("cpu0", "1", 4 << 20)]}, {"1": 0}, host_memory_device=0)
    assert states == {
        0: AquaDeviceState("consumer", lent_bytes=8 << 20, borrowed_bytes=4 << 20, paired_with=0)
    }


def test_it_counts_borrowed_bytes_even_when_the_lenders_device_is_unknown() -> None:
    states = device_states({"regions": [_region("nvme:weird", "dep-a", 1 << 20)]}, {"dep-a": 3})
    assert states == {3: AquaDeviceState("consumer", lent_bytes=0, borrowed_bytes=1 << 20, paired_with=None)}


def test_pairings_follow_lease_order_not_the_text_of_region_ids() -> None:
    # Deployment "c" (device 0) borrows from "p2" (device 2, region r2, leased first) and "p10"
    # (device 1, region r10): it is paired with its first lender, not with "r10" < "r2" as text.
    regions = [
        {**_region("cuda:1", "c", 1 << 20, producer_id="p10"), "region_id": "r10"},
        {**_region("cuda:2", "c", 1 << 20, producer_id="p2"), "region_id": "r2"},
    ]
    states = device_states({"regions": regions}, {"c": 0, "p2": 2, "p10": 1})
    assert states[0].paired_with == 2
    assert (states[1].paired_with, states[2].paired_with) == (0, 0)
