"""Concrete GPU indices for the models placed on one server."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from serving.placement.inputs import PlacementError


def allocate_gpus(
    num_gpus: int,
    demands: Sequence[tuple[str, int]],
    preferred: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, tuple[int, ...]]:
    """Give every (model, tp) in `demands` `tp` distinct GPU indices in [0, num_gpus).

    Models listed in `preferred` keep those indices when they are valid (right count, in range,
    not taken by another kept model), so a model that stays on its server does not move GPUs.
    The rest go, largest tp first (ties by name), to the lowest free block aligned to tp (so TP
    groups sit in NVLink/NUMA-friendly blocks: 0-3, 4-7), else the lowest contiguous free block,
    else the lowest free indices.

    Returns:
        model -> sorted GPU indices.

    Raises:
        PlacementError: The demands need more GPUs than the server has.
    """
    total = sum(tp for _, tp in demands)
    if total > num_gpus:
        raise PlacementError(f"{total} GPUs demanded on a server with {num_gpus}")
    free = [True] * num_gpus
    out: dict[str, tuple[int, ...]] = {}
    preferred = preferred or {}
    for name, tp in sorted(demands, key=lambda d: d[0]):
        want = tuple(sorted(preferred.get(name, ())))
        if len(want) == tp and len(set(want)) == tp and all(0 <= g < num_gpus and free[g] for g in want):
            out[name] = want
            for g in want:
                free[g] = False
    for name, tp in sorted((d for d in demands if d[0] not in out), key=lambda d: (-d[1], d[0])):
        block = _aligned_block(free, tp) or _contiguous_block(free, tp)
        if block is None:
            block = tuple(g for g in range(num_gpus) if free[g])[:tp]
        out[name] = block
        for g in block:
            free[g] = False
    return out


def _aligned_block(free: list[bool], tp: int) -> tuple[int, ...] | None:
    for start in range(0, len(free) - tp + 1, tp):
        if all(free[start : start + tp]):
            return tuple(range(start, start + tp))
    return None


def _contiguous_block(free: list[bool], tp: int) -> tuple[int, ...] | None:
    for start in range(len(free) - tp + 1):
        if all(free[start : start + tp]):
            return tuple(range(start, start + tp))
    return None
