"""A fast starting solution for CP-SAT: a sum-of-squares greedy, then swap/move local search.

CP-SAT alone makes little progress on a few hundred models in a couple of seconds (its search
starts from the naive greedy's imbalance), so the ILP is hinted with this solution and then
searches for better ones and for a bound. Both steps minimise, lexicographically,

    (objective, sum_s (mem_s - W/S)^2 + role_weight^2 * sum_s (role_s - R/S)^2)

The second term (spread around the mean) breaks the plateaus of the max-based objective.
Construction: models by (tp desc, |w| desc, name), each to the server with room that adds the
least spread. Local search: repeatedly apply the best improving move among (a) swapping a model with
one of equal tp on another server and (b) moving a model to a server with free GPUs, never onto
GPUs with less memory than the model needs (instance.needs), trying servers
in order of their deviation from the mean; stop at a local optimum or the deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from serving.placement.inputs import PlacementCancelled, PlacementError
from serving.placement.instance import PlacementInstance


class _State:
    """Per-server balances of an assignment, updated in place by moves."""

    def __init__(self, instance: PlacementInstance, assignment: list[int]) -> None:
        self.inst = instance
        self.w = instance.weight_matrix().astype(np.float64)  # w[m, s]: m's balance on server s
        self.r = np.array(instance.roles, dtype=np.float64)
        self.tp = np.array(instance.tps, dtype=np.int64)
        self.cap = np.array(instance.capacities, dtype=np.int64)
        self.need = np.array(instance.needs, dtype=np.int64)
        self.gpu_memory = np.array(instance.gpu_memory, dtype=np.int64)
        self.rw = float(instance.role_weight)
        n = instance.num_servers
        self.where = np.array(assignment, dtype=np.int64)
        models = np.arange(instance.num_models)
        self.mem = np.bincount(self.where, weights=self.w[models, self.where], minlength=n)
        self.role = np.bincount(self.where, weights=self.r, minlength=n)
        self.used = np.bincount(self.where, weights=self.tp, minlength=n).astype(np.int64)
        self.mem_mean = float(self.mem.sum()) / n
        self.role_mean = float(self.r.sum()) / n

    def key(self) -> tuple[float, float]:
        obj = np.abs(self.mem).max() + self.rw * np.abs(self.role).max()
        spread = ((self.mem - self.mem_mean) ** 2).sum() + self.rw**2 * (
            (self.role - self.role_mean) ** 2
        ).sum()
        return float(obj), float(spread)

    def best_move_from(self, s: int) -> tuple[tuple[float, float], int, int] | None:
        """Best (key, model a on s, partner) over every model a on s, where partner >= 0 is a
        model of equal tp on another server to swap with, and partner < 0 encodes a move of a to
        server -partner - 1 (which has room). All candidates are evaluated in one vectorised pass."""
        on_s = np.flatnonzero(self.where == s)
        if len(on_s) == 0:
            return None
        n_servers = len(self.mem)
        # swaps: (a on s, b elsewhere with the same tp, whose server's GPUs hold a, as s's hold b)
        same_tp = (
            (self.tp[on_s][:, None] == self.tp[None, :])
            & (self.where != s)[None, :]
            & (self.need[on_s][:, None] <= self.gpu_memory[self.where][None, :])
            & (self.need <= self.gpu_memory[s])[None, :]
        )
        sa, sb = np.nonzero(same_tp)
        # moves: (a on s, server t != s with room for a, on GPUs that hold it)
        room = (
            (self.used[None, :] + self.tp[on_s][:, None] <= self.cap[None, :])
            & (np.arange(n_servers) != s)[None, :]
            & (self.need[on_s][:, None] <= self.gpu_memory[None, :])
        )
        ma, mt = np.nonzero(room)
        a_idx = np.concatenate([on_s[sa], on_s[ma]])
        if len(a_idx) == 0:
            return None
        ts = np.concatenate([self.where[sb], mt])
        # server s gains dws (b's weight there, less a's), server t gains dwt (a's, less b's):
        # a model's weight depends on its server's GPU memory (instance.weight)
        dws = np.concatenate([self.w[sb, s], np.zeros(len(ma))]) - self.w[a_idx, s]
        dwt = self.w[a_idx, ts] - np.concatenate([self.w[sb, self.where[sb]], np.zeros(len(ma))])
        dr = np.concatenate([self.r[sb], np.zeros(len(ma))]) - self.r[a_idx]
        partners = np.concatenate([sb, -mt - 1])
        obj, spread = self._evaluate(s, ts, dws, dwt, dr)
        i = int(np.lexsort((spread, obj))[0])
        return (float(obj[i]), float(spread[i])), int(a_idx[i]), int(partners[i])

    def _evaluate(
        self, s: int, ts: np.ndarray, dws: np.ndarray, dwt: np.ndarray, dr: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Keys after server s gains (dws, dr) and servers ts gain (dwt, -dr) (vectorised over ts)."""
        new_ms, new_mt = self.mem[s] + dws, self.mem[ts] + dwt
        new_rs, new_rt = self.role[s] + dr, self.role[ts] - dr
        obj = np.maximum(np.maximum(np.abs(new_ms), np.abs(new_mt)), _max_excluding(np.abs(self.mem), s, ts))
        obj += self.rw * np.maximum(
            np.maximum(np.abs(new_rs), np.abs(new_rt)), _max_excluding(np.abs(self.role), s, ts)
        )
        mm, rm, rw2 = self.mem_mean, self.role_mean, self.rw**2
        spread = (
            (new_ms - mm) ** 2
            - (self.mem[s] - mm) ** 2
            + (new_mt - mm) ** 2
            - (self.mem[ts] - mm) ** 2
            + rw2
            * ((new_rs - rm) ** 2 - (self.role[s] - rm) ** 2 + (new_rt - rm) ** 2 - (self.role[ts] - rm) ** 2)
        )
        return obj, self.key()[1] + spread

    def apply(self, a: int, partner: int) -> None:
        s = int(self.where[a])
        if partner >= 0:
            t = int(self.where[partner])
            self._shift(partner, t, s)
        else:
            t = -partner - 1
        self._shift(a, s, t)

    def _shift(self, m: int, src: int, dst: int) -> None:
        self.where[m] = dst
        self.mem[src] -= self.w[m, src]
        self.mem[dst] += self.w[m, dst]
        self.role[src] -= self.r[m]
        self.role[dst] += self.r[m]
        self.used[src] -= self.tp[m]
        self.used[dst] += self.tp[m]


def _max_excluding(values: np.ndarray, s: int, ts: np.ndarray) -> np.ndarray:
    """max(values) over all servers except s and ts[i], for each i (0 when none is left)."""
    top = np.argsort(-values, kind="stable")[:3].tolist()
    out = np.zeros(len(ts))
    filled = np.zeros(len(ts), dtype=bool)
    for idx in top:
        if idx == s:
            continue
        take = ~filled & (ts != idx)
        out[take] = values[idx]
        filled |= take
    return out


def _better(new: tuple[float, float], cur: tuple[float, float]) -> bool:
    """Strictly better key; objectives are exact integers, spreads carry float rounding."""
    if new[0] != cur[0]:
        return new[0] < cur[0]
    return new[1] < cur[1] - 1e-9 * abs(cur[1]) - 1e-6


def spread_greedy(instance: PlacementInstance) -> list[int]:
    """Construction step (module docstring). Raises PlacementError if some model does not fit.
    Each step scores every server at once (numpy), as greedy.greedy_assignment does."""
    n = instance.num_servers
    mem_mean = sum(instance.weights) / n
    role_mean = sum(instance.roles) / n
    rw2 = instance.role_weight**2
    mem, role = np.zeros(n), np.zeros(n)
    weights = instance.weight_matrix()
    used = np.zeros(n, dtype=np.int64)
    cap = np.array(instance.capacities, dtype=np.int64)
    gpu_memory = np.array(instance.gpu_memory, dtype=np.int64)
    out = [-1] * instance.num_models
    order = sorted(
        range(instance.num_models),
        key=lambda m: (-instance.tps[m], -abs(instance.weights[m]), instance.models[m].name),
    )
    for m in order:
        w, r, tp = weights[m], instance.roles[m], instance.tps[m]
        room = (used + tp <= cap) & (gpu_memory >= instance.needs[m])
        if not room.any():
            raise PlacementError(
                f"no server has {tp} free GPUs of at least {instance.needs[m]} bytes "
                f"for model {instance.models[m].name!r}"
            )
        # increase of the spread if m goes to s
        delta = w * (2 * (mem - mem_mean) + w) + rw2 * r * (2 * (role - role_mean) + r)
        s = int(np.argmin(np.where(room, delta, np.inf)))  # the first of equal deltas: the lowest index
        out[m] = s
        mem[s] += w[s]
        role[s] += r
        used[s] += tp
    return out


def improve(
    instance: PlacementInstance,
    assignment: list[int],
    deadline: float,
    should_cancel: Callable[[], bool] | None = None,
) -> list[int]:
    """Local search from `assignment` until a local optimum, `patience` moves in a row that do not
    lower the objective (they only narrow the spread), or `time.perf_counter() >= deadline`.

    The first two stops are deterministic; the deadline is a safety cap that a run normally does
    not reach (patience = 2 x servers + models bounds the plateau walk).
    """
    state = _State(instance, assignment)
    current = state.key()
    patience = 2 * instance.num_servers + instance.num_models
    stale = 0
    while stale < patience and time.perf_counter() < deadline:
        if should_cancel is not None and should_cancel():
            raise PlacementCancelled("placement cancelled during local search")
        deviation = np.abs(state.mem - state.mem_mean) + state.rw * np.abs(state.role - state.role_mean)
        moved = False
        for s in np.argsort(-deviation, kind="stable").tolist():
            found = state.best_move_from(s)
            if found is not None and _better(found[0], current):
                state.apply(found[1], found[2])
                stale = 0 if found[0][0] < current[0] else stale + 1
                current = state.key()
                moved = True
                break
            if time.perf_counter() >= deadline:
                break
        if not moved:
            break
    return state.where.tolist()
