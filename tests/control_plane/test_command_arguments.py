"""Management commands refuse bad arguments with a CommandError naming them, and write nothing.

Each of these used to end in a traceback (on PostgreSQL, ``value too long for type character
varying(N)``; ``ValueError`` for an empty username) or quietly store a value nothing could use: a
host named '' or an address ``10.0.0.5:9000`` the gateway then built ``http://[10.0.0.5:9000]:8001``
from. Limits are read from the model fields, as the commands read them.
"""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from accounts.models import ApiToken, Role, User
from agents.services import replica_url
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from inventory.models import AgentToken, Host
from registry.models import ServedModel

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip()


def refused(*args: str) -> str:
    with pytest.raises(CommandError) as err:
        run(*args)
    return str(err.value)


def limit(model: type, field: str) -> int:
    max_length = model._meta.get_field(field).max_length  # type: ignore[attr-defined]
    assert isinstance(max_length, int)
    return max_length


@pytest.mark.parametrize("command", ["register_host", "local_agent"])
def test_a_host_name_must_be_a_non_empty_slug_within_the_limit(command: str) -> None:
    assert refused(command, "") == "host name '' is empty"
    too_long = "h" * (limit(Host, "name") + 1)
    message = refused(command, too_long)
    assert f"limit of {limit(Host, 'name')} characters" in message and "'hhhh" in message
    assert "slug" in refused(command, "Not A Slug")
    assert not Host.objects.exists() and not AgentToken.objects.exists()
    run(command, "h" * limit(Host, "name"))  # the limit itself is fine
    assert Host.objects.get().name == "h" * limit(Host, "name")


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("10.0.0.5:9000", "HOST:PORT"),
        ("[::1]:9000", "HOST:PORT"),
        ("http://10.0.0.5", "URL"),
        ("", "empty"),
        ("   ", "empty"),
        ("gpu 1", "whitespace"),
        ("[10.0.0.5]", "IPv6 addresses only"),
    ],
)
def test_register_host_refuses_an_address_the_gateway_could_not_use(address: str, why: str) -> None:
    message = refused("register_host", "gpu-1", "--address", address)
    assert message.startswith(f"--address {address!r}") and why in message
    assert not Host.objects.exists() and not AgentToken.objects.exists()


def test_register_host_refuses_an_address_over_the_field_limit() -> None:
    message = refused("register_host", "gpu-1", "--address", "a" * 300)
    assert message.startswith("--address 'aaa") and "(300 characters)" in message
    assert f"limit of {limit(Host, 'address')} characters" in message
    assert not Host.objects.exists()


@pytest.mark.parametrize(
    ("address", "stored", "url"),
    [
        ("10.0.0.5", "10.0.0.5", "http://10.0.0.5:8001"),
        ("gpu-1.example.com", "gpu-1.example.com", "http://gpu-1.example.com:8001"),
        ("2001:db8::5", "2001:db8::5", "http://[2001:db8::5]:8001"),
        ("[2001:db8::5]", "2001:db8::5", "http://[2001:db8::5]:8001"),  # stored as agents send it
    ],
)
def test_register_host_stores_an_address_replica_urls_are_built_from(
    address: str, stored: str, url: str
) -> None:
    token = run("register_host", "gpu-1", "--address", address)
    host = Host.objects.get(name="gpu-1")
    assert host.address == stored and AgentToken.objects.filter(host=host, revoked=False).count() == 1
    assert token.startswith("agt")
    assert replica_url(host.address, 8001) == url


def test_register_host_without_an_address_leaves_it_to_the_agent() -> None:
    run("register_host", "gpu-1")
    assert Host.objects.get(name="gpu-1").address == ""


def test_register_host_again_for_a_new_token_keeps_the_hosts_address_and_simulated_flag() -> None:
    """Run again without --address or --simulated (a lost token), it wiped the address replicas are
    reached at and made a simulated host a real one, whose models /v1 then listed and answered 503."""
    first = run("register_host", "sim-1", "--address", "10.0.0.5", "--simulated")
    second = run("register_host", "sim-1")
    host = Host.objects.get(name="sim-1")
    assert (host.address, host.simulated) == ("10.0.0.5", True) and second != first
    assert second.startswith(AgentToken.objects.get(host=host, revoked=False).prefix)  # the first revoked
    run("register_host", "sim-1", "--address", "10.0.0.6")  # what is given still replaces it
    assert Host.objects.get(name="sim-1").address == "10.0.0.6"


def test_the_host_model_validates_its_address() -> None:
    host = Host(name="gpu-1", address="10.0.0.5:9000")
    with pytest.raises(ValidationError) as err:
        host.full_clean()
    assert "address" in err.value.message_dict
    Host(name="gpu-1", address="gpu-1.example.com").full_clean()
    Host(name="gpu-2", address="").full_clean()  # not known until the agent registers


@pytest.mark.parametrize(
    ("username", "named"),
    [("", "--username '' is empty"), ("bad name!", "--username 'bad name!'")],
)
def test_bootstrap_admin_refuses_a_username_the_user_model_would_not_take(username: str, named: str) -> None:
    assert refused("bootstrap_admin", "--username", username).startswith(named)
    assert not User.objects.exists()


def test_bootstrap_admin_refuses_a_username_over_the_field_limit() -> None:
    message = refused("bootstrap_admin", "--username", "u" * 200)
    assert message.startswith("--username 'uuu") and "(200 characters)" in message
    assert f"limit of {limit(User, 'username')} characters" in message
    assert not User.objects.exists()


def test_bootstrap_admin_refuses_the_name_of_a_user_who_is_not_an_admin() -> None:
    User.objects.create_user(username="bob", password="bob-pw-9f2k", role=Role.VIEWER)
    assert "'bob' exists" in refused("bootstrap_admin", "--username", "bob")
    assert list(User.objects.values_list("username", "role")) == [("bob", Role.VIEWER)]
    assert "Created admin user 'root'" in run("bootstrap_admin", "--username", "root")


@pytest.mark.parametrize(("name", "named"), [("", "--name '' is blank"), (" ", "--name ' ' is blank")])
def test_issue_api_token_refuses_a_blank_name(name: str, named: str) -> None:
    User.objects.create_user(username="bob", password="bob-pw-9f2k")
    assert refused("issue_api_token", "bob", "--name", name) == named
    assert not ApiToken.objects.exists()


def test_issue_api_token_refuses_a_name_over_the_field_limit() -> None:
    User.objects.create_user(username="bob", password="bob-pw-9f2k")
    message = refused("issue_api_token", "bob", "--name", "n" * (limit(ApiToken, "name") + 1))
    assert message.startswith("--name 'nnn") and f"limit of {limit(ApiToken, 'name')} characters" in message
    assert not ApiToken.objects.exists()
    assert run("issue_api_token", "bob", "--name", "n" * limit(ApiToken, "name")).startswith("tok")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("bob", "--name", "ci\x00bot"), "--name 'ci\\x00bot' holds a NUL character"),
        (("bob\x00",), "username 'bob\\x00' holds a NUL character; no user's name does"),
    ],
)
def test_issue_api_token_refuses_a_nul_character(args: tuple[str, ...], named: str) -> None:
    # On PostgreSQL both raised DataError (text cannot hold NUL): a traceback; SQLite stored the name.
    User.objects.create_user(username="bob", password="bob-pw-9f2k")
    assert refused("issue_api_token", *args) == named
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize(
    ("name", "named"),
    [
        (
            "ci\nbot",
            "--name 'ci\\nbot': Control characters (newline, tab, escape, ...) are not allowed: '\\n' at",
        ),
        ("\x1b[2Jci", "--name '\\x1b[2Jci': Control characters"),
        ("ci\tbot", "'\\t' at index 2"),
        ("ci\x7f", "'\\x7f' at index 2"),
    ],
)
def test_issue_api_token_refuses_a_control_character(name: str, named: str) -> None:
    """A newline forged a second line in lists of tokens and logs; an escape drove the terminal."""
    User.objects.create_user(username="bob", password="bob-pw-9f2k")
    assert named in refused("issue_api_token", "bob", "--name", name)
    assert not ApiToken.objects.exists()
    assert run("issue_api_token", "bob", "--name", "ci bot ü").startswith("tok")  # spaces, letters: fine


def test_local_agent_refuses_a_tiny_model_path_longer_than_a_models_source(tmp_path: Path) -> None:
    # On PostgreSQL: DataError "value too long for type character varying(500)", a traceback;
    # SQLite stored a source over the field's limit.
    limit_ = limit(ServedModel, "source")
    deep = tmp_path
    while len(str(deep)) <= limit_:
        deep = deep / ("d" * 100)
    deep.mkdir(parents=True)
    message = refused("local_agent", "local", "--tiny-model", str(deep))
    assert message.startswith(f"--tiny-model {str(deep)[:40]!r}... ({len(str(deep))} characters")
    assert f"limit of {limit_} characters" in message
    assert not Host.objects.exists() and not ServedModel.objects.exists()
