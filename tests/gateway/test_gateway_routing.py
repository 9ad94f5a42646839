"""Replica choice: fewest outstanding first, recently failed last, ties by replica id."""

from __future__ import annotations

from gateway.routing import Router, Target

A, B, C = Target(1, 10, "http://a"), Target(2, 20, "http://b"), Target(3, 30, "http://c")


def test_it_prefers_the_replica_with_fewest_outstanding_requests_ties_by_id() -> None:
    router = Router()
    assert router.order([C, B, A], now=0) == [A, B, C]
    router.acquire(A)
    router.acquire(A)
    router.acquire(B)
    assert router.order([A, B, C], now=0) == [C, B, A]
    router.release(A)
    router.release(A)
    assert router.order([A, B, C], now=0) == [A, C, B]
    assert router.outstanding(A.replica_id) == 0


def test_it_tries_a_recently_failed_replica_last_until_its_penalty_ends() -> None:
    router = Router(failure_penalty_s=5.0)
    router.failed(A, now=100.0)
    assert router.order([A, B], now=101.0) == [B, A]
    router.acquire(B)
    router.acquire(B)
    assert router.order([A, B], now=104.9) == [B, A], "a failed replica stays last even if idle"
    assert router.order([A, B], now=105.1) == [A, B]


def test_it_balances_a_sequence_of_requests_across_replicas() -> None:
    router = Router()
    chosen = []
    for _ in range(6):
        target = router.order([A, B, C], now=0)[0]
        router.acquire(target)
        chosen.append(target.replica_id)
    assert chosen == [1, 2, 3, 1, 2, 3]
