"""``manage.py clear_login_limits`` forgets the failed sign-ins it names, and only those."""

from __future__ import annotations

from io import StringIO

import pytest
from accounts.models import User
from django.conf import settings
from django.core.cache import cache
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings

pytestmark = pytest.mark.django_db

BOB_PASSWORD = "bob-pw-9f2k"
CHARLIE_PASSWORD = "charlie-pw-9f2k"
LOCKED = "Too many failed sign-ins"


def locked(username: str, password: str, address: str) -> bool:
    """Whether a sign-in with the right password from ``address`` is refused as locked; signs in
    otherwise (which clears that username's count from that address)."""
    client = Client(REMOTE_ADDR=address)
    response = client.post("/accounts/login/", {"username": username, "password": password})
    is_locked = LOCKED in response.content.decode()
    assert is_locked != ("_auth_user_id" in client.session)
    return is_locked


def fail(username: str, address: str, times: int) -> None:
    for _ in range(times):
        Client(REMOTE_ADDR=address).post("/accounts/login/", {"username": username, "password": "guess"})


def clear(*args: str) -> str:
    out = StringIO()
    call_command("clear_login_limits", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@override_settings(LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS=2)
def test_it_clears_a_usernames_counts_from_every_address(bob: User, charlie: User) -> None:
    fail("bob", "10.0.0.1", 2)
    fail("bob", "10.0.0.2", 2)
    fail("charlie", "10.0.0.1", 2)
    assert locked("bob", BOB_PASSWORD, "10.0.0.2")

    assert "'BOB'" in clear("--username", "BOB")  # any spelling

    assert not locked("bob", BOB_PASSWORD, "10.0.0.1")
    assert not locked("bob", BOB_PASSWORD, "10.0.0.2")
    assert locked("charlie", CHARLIE_PASSWORD, "10.0.0.1")


@override_settings(LOGIN_FAILURES_PER_USERNAME=3, LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS=100)
def test_it_clears_a_usernames_own_count(bob: User) -> None:
    for address in ("10.0.1.1", "10.0.1.2", "10.0.1.3"):
        fail("bob", address, 1)
    assert locked("bob", BOB_PASSWORD, "10.0.0.9")

    clear("--username", " bob ")

    assert not locked("bob", BOB_PASSWORD, "10.0.0.9")


@override_settings(LOGIN_FAILURES_PER_ADDRESS=3, LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS=2)
def test_it_clears_an_addresss_counts_for_every_username(bob: User, charlie: User) -> None:
    fail("root", "2001:db8::7", 1)
    fail("bob", "2001:db8::7", 2)  # the address's third failure, and bob's second from it
    fail("charlie", "10.0.0.3", 2)
    assert locked("charlie", CHARLIE_PASSWORD, "2001:db8::7")

    assert "2001:db8::7" in clear("--address", "2001:0db8:0:0:0:0:0:7")  # another spelling

    assert not locked("bob", BOB_PASSWORD, "2001:db8::7")
    assert locked("charlie", CHARLIE_PASSWORD, "10.0.0.3")


@override_settings(
    LOGIN_FAILURES_PER_USERNAME=3, LOGIN_FAILURES_PER_ADDRESS=3, LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS=2
)
def test_it_clears_every_count_and_nothing_else(bob: User, charlie: User) -> None:
    fail("bob", "10.0.0.1", 2)  # bob from there
    for name in ("root", "admin", "operator"):
        fail(name, "10.0.0.2", 1)  # the address
    for address in ("10.0.1.1", "10.0.1.2", "10.0.1.3"):
        fail("charlie", address, 1)  # charlie from anywhere
    assert locked("bob", BOB_PASSWORD, "10.0.0.1")
    assert locked("bob", BOB_PASSWORD, "10.0.0.2")
    assert locked("charlie", CHARLIE_PASSWORD, "10.0.0.9")
    cache.set("someone-elses-key", 7)

    clear("--all")

    assert not locked("bob", BOB_PASSWORD, "10.0.0.1")
    assert not locked("bob", BOB_PASSWORD, "10.0.0.2")
    assert not locked("charlie", CHARLIE_PASSWORD, "10.0.0.9")
    assert cache.get("someone-elses-key") == 7


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give --username USERNAME, --address ADDRESS or --all"),
        (("--address", "10.0.0.300"), "--address '10.0.0.300' is not an IP address"),
        (("--address", "localhost"), "--address 'localhost' is not an IP address"),
        (("--username", "  "), "--username '  ' is blank"),
        (("--all", "--username", "bob"), "--all clears every count"),
    ],
)
@override_settings(LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS=2)
def test_it_refuses_bad_input_and_clears_nothing(bob: User, args: tuple[str, ...], message: str) -> None:
    fail("bob", "10.0.0.1", 2)

    with pytest.raises(CommandError) as refused:
        clear(*args)

    assert message in str(refused.value)
    assert locked("bob", BOB_PASSWORD, "10.0.0.1")


def test_it_warns_when_the_cache_is_its_own_processs_memory() -> None:
    """Without REDIS_URL a running server counts in its own memory, out of the command's reach."""
    err = StringIO()
    call_command("clear_login_limits", "--all", stdout=StringIO(), stderr=err)
    assert ("restart it" in err.getvalue()) == ("locmem" in settings.CACHES["default"]["BACKEND"])
