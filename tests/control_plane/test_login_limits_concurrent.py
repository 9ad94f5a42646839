"""Concurrent sign-ins: a count lets at most its limit of passwords be checked in its window, however
many sign-ins arrive together (the password check is slow by design, and Django runs sync views in
threads, so parallel guesses are all in flight at once)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest
from accounts import login_limits
from accounts.login_limits import SignInLocked
from accounts.models import User
from django.contrib.auth import authenticate
from django.contrib.auth.backends import ModelBackend
from django.db import connection
from django.test import RequestFactory, override_settings

# Committed data: the sign-ins run on threads of their own, each with its own database connection.
pytestmark = pytest.mark.django_db(transaction=True)

GUESSES = 12
LIMIT = 5


@pytest.fixture
def password_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The usernames whose password ModelBackend checked: each check made slow (a stand-in for the
    production hasher's work factor), so that every concurrent guess is in flight at once."""
    checked: list[str] = []
    lock = threading.Lock()
    check_password = ModelBackend.authenticate

    def slow_check(self: ModelBackend, request: Any, username: str | None = None, **kwargs: Any) -> Any:
        with lock:
            checked.append(str(username))
        time.sleep(0.3)
        return check_password(self, request, username=username, **kwargs)

    monkeypatch.setattr(ModelBackend, "authenticate", slow_check)
    return checked


def sign_in(username: str, password: str, address: str) -> User | SignInLocked | None:
    """The user signed in, the refusal, or None for a wrong password."""
    request = RequestFactory().post("/accounts/login/", REMOTE_ADDR=address)
    try:
        user: User | None = authenticate(request, username=username, password=password)
    except SignInLocked as locked:
        return locked
    return user


def sign_in_together(
    attempts: list[tuple[str, str]], password: str, monkeypatch: pytest.MonkeyPatch, count_together: bool
) -> list[User | SignInLocked | None]:
    """Sign in as each (username, address) at once, each on a thread of its own.

    With ``count_together``, every sign-in is held after the read that refuses a count already at its
    limit until all have passed it, so the counting alone must keep the limits.
    """
    barrier = threading.Barrier(len(attempts), timeout=30)
    counted = threading.Barrier(len(attempts), timeout=30)
    held = threading.local()  # .before_count: this thread's sign-in has not counted yet
    count = login_limits._count

    def count_after_all_read(budget: Any, now: float) -> Any:
        if getattr(held, "before_count", False):
            held.before_count = False
            counted.wait()
        return count(budget, now)

    if count_together:
        monkeypatch.setattr(login_limits, "_count", count_after_all_read, raising=False)
    results: list[User | SignInLocked | None] = [None] * len(attempts)

    def attempt(i: int, username: str, address: str) -> None:
        held.before_count = True
        barrier.wait()
        try:
            results[i] = sign_in(username, password, address)
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt, args=(i, *a)) for i, a in enumerate(attempts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@dataclass(frozen=True)
class Race:
    limits: dict[str, int]
    guesses: list[tuple[str, str]]  # (username, address) of each concurrent guess
    whose: str  # the count that locks
    locked_out: tuple[str, str]  # (username, address) refused afterwards, even with the right password
    let_in: list[tuple[str, str]]  # (username, address) that still sign in afterwards


OTHERS_HIGH = {
    "LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS": GUESSES,
    "LOGIN_FAILURES_PER_USERNAME": GUESSES,
    "LOGIN_FAILURES_PER_ADDRESS": GUESSES,
}
RACES = {
    # Bob and charlie still sign in: the refused guesses are taken back from the username's and the
    # address's counts, which GUESSES would fill.
    "pair": Race(
        {**OTHERS_HIGH, "LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS": LIMIT},
        [("bob", "198.51.100.7")] * GUESSES,
        "for this username from this address",
        ("bob", "198.51.100.7"),
        [("bob", "10.0.0.9"), ("charlie", "198.51.100.7")],
    ),
    "username": Race(
        {**OTHERS_HIGH, "LOGIN_FAILURES_PER_USERNAME": LIMIT},
        [("bob", f"10.0.1.{i}") for i in range(GUESSES)],
        "for this username",
        ("bob", "10.0.0.9"),
        [("charlie", "10.0.1.0")],
    ),
    "address": Race(
        {**OTHERS_HIGH, "LOGIN_FAILURES_PER_ADDRESS": LIMIT},
        [(f"user{i}", "198.51.100.7") for i in range(GUESSES)],
        "from this address",
        ("bob", "198.51.100.7"),
        [("bob", "10.0.0.9")],
    ),
}


@pytest.mark.parametrize("count_together", [False, True], ids=["as-they-come", "counted-together"])
@pytest.mark.parametrize("race", RACES.values(), ids=RACES.keys())
def test_it_checks_at_most_the_limit_of_concurrent_guesses(
    race: Race,
    count_together: bool,
    password_checks: list[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for username in ("bob", "charlie"):
        User.objects.create_user(username=username, password=f"{username}-pw-9f2k")

    with override_settings(**race.limits), caplog.at_level(logging.WARNING, logger="accounts"):
        results = sign_in_together(race.guesses, "guess", monkeypatch, count_together)
        monkeypatch.undo()  # the sign-ins below count as they come, and check at full speed

        assert len(password_checks) == LIMIT
        refused = [r for r in results if isinstance(r, SignInLocked)]
        assert len(refused) == GUESSES - LIMIT
        assert results.count(None) == LIMIT
        for locked in refused:
            # Refused while the checks were in flight (in a moment, when they have failed, locked).
            in_progress = f"in progress {race.whose}; try again in a moment." in locked.message
            failed = f"failed sign-ins {race.whose};" in locked.message and 1 < locked.retry_after_s <= 900
            assert (in_progress and locked.retry_after_s == 1) or failed
        locking = f" s: {LIMIT} failures {race.whose} "
        assert any(m.startswith("locking sign-ins for") and locking in m for m in caplog.messages)

        username, address = race.locked_out
        locked_out = sign_in(username, f"{username}-pw-9f2k", address)
        assert isinstance(locked_out, SignInLocked) and not locked_out.in_progress
        assert f"Too many failed sign-ins {race.whose};" in locked_out.message
        assert 1 < locked_out.retry_after_s <= 900
        for username, address in race.let_in:
            signed_in = sign_in(username, f"{username}-pw-9f2k", address)
            assert isinstance(signed_in, User) and signed_in.username == username


@override_settings(LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS=LIMIT)
def test_it_tells_concurrent_sign_ins_with_the_right_password_to_try_again_in_a_moment(
    password_checks: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script fetching tokens in parallel, or an office behind one NAT: nothing failed, so nothing
    is locked for the window; the sign-ins past the limit while checks are in flight retry in a
    second, and sign in."""
    User.objects.create_user(username="bob", password="bob-pw-9f2k")
    together = LIMIT + 3

    results = sign_in_together([("bob", "198.51.100.7")] * together, "bob-pw-9f2k", monkeypatch, True)
    monkeypatch.undo()

    assert len(password_checks) == LIMIT
    assert sum(isinstance(r, User) for r in results) == LIMIT
    refused = [r for r in results if isinstance(r, SignInLocked)]
    assert len(refused) == together - LIMIT
    in_progress = "Too many sign-ins in progress for this username from this address; try again in a moment."
    assert [(busy.message, busy.retry_after_s) for busy in refused] == [(in_progress, 1)] * len(refused)
    assert all(busy.in_progress for busy in refused)
    for _ in refused:
        assert isinstance(sign_in("bob", "bob-pw-9f2k", "198.51.100.7"), User)
