"""Each user's requests share the engines' prefix cache with their own requests only.

vLLM caches the KV of prompt prefixes across every request of an engine (automatic prefix
caching): a prompt that begins as a recent one did skips that part of its prefill, so its first
token comes sooner. Through a shared engine, one user could then tell from the TTFT whether anyone
had recently sent a given prefix: a timing side channel on other users' prompts. vLLM's
``cache_salt`` (a request field mixed into the hash of the prompt's first block) separates caches,
so the gateway sets it to an HMAC of the key's owner and the client's own salt, if it sent one: a
user's requests (all their keys, the playground's included) reuse each other's prefixes and no one
else's, as OpenAI does not share prompt caches between organizations. The cost is reuse of a common
system prompt across users; ``GATEWAY_SHARED_PREFIX_CACHE=true`` forwards the client's salt as sent,
for deployments whose users trust each other.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils.crypto import salted_hmac

from gateway.errors import GatewayError, bad_request

_SALT = "gateway.cache_salt"
# vLLM's own limits on a client's cache_salt (vllm/entrypoints/generate/base/protocol.py), checked
# here because the engine never sees the client's value when the gateway replaces it.
MAX_CLIENT_SALT = 128
FORBIDDEN_SALT_CHARS = frozenset("@/\\\x00")


def check_client_salt(body: dict[str, Any]) -> GatewayError | None:
    """A 400 for a ``cache_salt`` vLLM would refuse; None when it is absent or fine."""
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        return bad_request("'cache_salt' must be a non-empty string if provided", "cache_salt")
    if len(salt) > MAX_CLIENT_SALT or FORBIDDEN_SALT_CHARS & set(salt):
        return bad_request(
            f"'cache_salt' must be at most {MAX_CLIENT_SALT} characters and must not contain "
            "'@', '/', '\\' or NUL",
            "cache_salt",
        )
    return None


def with_user_salt(body: dict[str, Any], user_id: int) -> dict[str, Any]:
    """``body`` with the ``cache_salt`` of ``user_id`` (and of the client's salt, if any)."""
    if settings.GATEWAY_SHARED_PREFIX_CACHE:
        return body
    client = body.get("cache_salt") or ""
    salt = salted_hmac(_SALT, f"{user_id}\x00{client}", algorithm="sha256").hexdigest()
    return {**body, "cache_salt": salt}
