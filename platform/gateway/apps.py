from __future__ import annotations

from django.apps import AppConfig


class GatewayConfig(AppConfig):
    """The end users' OpenAI-compatible chat gateway (/v1): API keys, quotas, usage, replica routing,
    per-request latency samples, and the dashboard's chat playground."""

    name = "gateway"
    verbose_name = "Chat gateway"
