"""The gateway salts each request with its key's owner, so users never share prefix-cache entries.

vLLM's automatic prefix caching serves a prompt whose beginning a recent request sent faster; on a
shared engine the TTFT would tell one user whether another recently sent a given prefix. With the
owner's salt (gateway/cache_salt.py) a user's requests hit only their own cached prefixes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from accounts.models import User
from accounts.services import create_api_key

from tests.gateway.asgi_driver import CHAT, app_with, call

pytestmark = pytest.mark.usefixtures("gateway_data")


def _salts(gateway_data: dict[str, Any], secrets: list[str], body: dict[str, Any]) -> list[Any]:
    """The cache_salt the engine got for one request with each of ``secrets``."""
    sent: list[Any] = []

    def engine(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content).get("cache_salt"))
        return httpx.Response(
            200, json={"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
        )

    app = app_with(engine)
    for secret in secrets:
        result = asyncio.run(call(app, "/v1/chat/completions", body, secret))
        assert result.status == 200, result.body
    return sent


def _key_of(user: User, name: str) -> str:
    return create_api_key(user, name).plaintext


def test_keys_of_one_user_share_a_salt_and_other_users_get_another(gateway_data: dict[str, Any]) -> None:
    owner = gateway_data["user"]
    other = User.objects.create_user(username="someone-else", password="pw-someone-else-7x")
    secrets = [gateway_data["secret"], _key_of(owner, "second"), _key_of(other, "theirs")]
    mine, my_second, theirs = _salts(gateway_data, secrets, CHAT)
    assert isinstance(mine, str) and mine == my_second
    assert theirs != mine
    # A client's own salt separates further, within its owner's share only.
    salted = _salts(gateway_data, secrets[:1], {**CHAT, "cache_salt": "tenant-a"})[0]
    assert salted not in (mine, theirs, "tenant-a")


def test_a_shared_prefix_cache_forwards_the_clients_salt_as_sent(
    gateway_data: dict[str, Any], settings: Any
) -> None:
    settings.GATEWAY_SHARED_PREFIX_CACHE = True
    secret = gateway_data["secret"]
    assert _salts(gateway_data, [secret], CHAT) == [None]
    assert _salts(gateway_data, [secret], {**CHAT, "cache_salt": "tenant-a"}) == ["tenant-a"]


@pytest.mark.parametrize("salt", ["", 5, "x" * 129, "a/b", "a@b"])
def test_a_cache_salt_vllm_would_refuse_is_a_400(gateway_data: dict[str, Any], salt: Any) -> None:
    app = app_with(lambda request: httpx.Response(500))
    result = asyncio.run(
        call(app, "/v1/chat/completions", {**CHAT, "cache_salt": salt}, gateway_data["secret"])
    )
    assert result.status == 400
    assert json.loads(result.body)["error"]["param"] == "cache_salt"
