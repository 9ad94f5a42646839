"""The key a deployment's engine takes generation requests with.

An engine (vLLM's OpenAI server) listens on its host's address, where the gateway reaches it: on
that network anyone could otherwise send it completions directly, past the gateway's end-user keys,
rate limits and token quotas. So each deployment's engine is started with a key of its own
(vLLM's ``VLLM_API_KEY``: requests under ``/v1`` without ``Authorization: Bearer <key>`` are a
401), which the control plane sends the host's agent in the deployment's spec and the gateway sends
with every request it relays.

The key is derived, not stored: an HMAC of the deployment's id under SECRET_KEY (which every web and
worker process shares), so no column holds it and no migration is needed. Changing SECRET_KEY
changes every key; the agents then get new specs and restart their engines with the new keys.
"""

from __future__ import annotations

from django.utils.crypto import salted_hmac

_SALT = "deployments.engine_api_key"


def engine_api_key(deployment_id: int) -> str:
    """The engine key of deployment ``deployment_id``: 64 hex digits (256 bits)."""
    return salted_hmac(_SALT, str(deployment_id), algorithm="sha256").hexdigest()
