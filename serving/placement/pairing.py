"""One-to-one producer -> consumer pairing inside one server (NVLink domain).

A producer may lend to a consumer only if its lendable bytes cover the consumer's whole need
(Aqua allocates a consumer's region all-or-nothing); it lends at most the memory of its own GPUs on
the server. Among such pairs we solve an exact maximum
weight bipartite matching (scipy's linear_sum_assignment, Hungarian/Jonker-Volgenant) with weight
BIG + needed_bytes, BIG > the sum of all needs: the matching first pairs as many consumers as
possible, then, among those, covers the most bytes, so the consumers left to host DRAM are the
fewest and the smallest.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from serving.placement.inputs import ModelProfile, ServerSpec
from serving.placement.plan import DramFallback, Pairing

Placed = tuple[ModelProfile, tuple[int, ...]]  # (profile, GPU indices)


def pair_within_server(
    server: ServerSpec, producers: Sequence[Placed], consumers: Sequence[Placed]
) -> tuple[list[Pairing], list[DramFallback]]:
    """Pair the consumers on `server` with its producers; report the rest as DRAM fallbacks.

    Args:
        server: The server; on a server without NVLink nothing is paired.
        producers: Producers placed on it, with their GPUs.
        consumers: Consumers placed on it, with their GPUs.

    Returns:
        (pairings sorted by lender, fallbacks sorted by model).
    """
    producers = sorted(producers, key=lambda p: p[0].name)
    consumers = sorted(consumers, key=lambda c: c[0].name)
    if not consumers:
        return [], []
    if not server.nvlink or not producers:
        reason = (
            "server has no NVLink: lending is only paired inside an NVLink domain"
            if not server.nvlink
            else "no producer on the server"
        )
        return [], [_fallback(server, c, reason) for c in consumers]

    # What a producer can lend here: its profile's figure, at most the memory of its GPUs on this
    # server (ModelProfile.lendable_on; the placer balances the same figure).
    lendable = [p.lendable_on(server.gpu_memory_bytes, server.nvlink) for p, _ in producers]
    lend = np.array(lendable, dtype=np.float64)
    need = np.array([c.needed_bytes for c, _ in consumers], dtype=np.float64)
    big = float(need.sum()) + 1.0
    covers = lend[:, None] >= need[None, :]  # producer i covers consumer j
    weight = np.where(covers, big + need[None, :], 0.0)
    rows, cols = linear_sum_assignment(weight, maximize=True)

    pairings: list[Pairing] = []
    paired: set[int] = set()
    for i, j in zip(rows.tolist(), cols.tolist(), strict=True):
        if not covers[i, j]:
            continue  # a zero-weight "pair" is no pair
        (p, p_gpus), (c, c_gpus) = producers[i], consumers[j]
        pairings.append(Pairing(server.name, p.name, p_gpus, c.name, c_gpus, c.needed_bytes, lendable[i]))
        paired.add(j)
    largest = max(lendable)
    fallbacks = []
    for j, c in enumerate(consumers):
        if j in paired:
            continue
        if largest < c[0].needed_bytes:
            reason = f"no producer on the server lends enough (largest lendable {largest} bytes)"
        else:
            reason = "every producer on the server that covers the need lends to another consumer"
        fallbacks.append(_fallback(server, c, reason))
    pairings.sort(key=lambda p: p.lender)
    return pairings, fallbacks


def _fallback(server: ServerSpec, consumer: Placed, reason: str) -> DramFallback:
    profile, gpus = consumer
    return DramFallback(profile.name, server.name, gpus, profile.needed_bytes, reason)
