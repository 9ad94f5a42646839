"""Template filters for pages built on dashboard/base.html (also other apps' pages, e.g. the playground)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from accounts.roles import is_admin
from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

register = template.Library()


@register.filter
def platform_admin(user: Any) -> bool:
    """``{% if user|platform_admin %}``: the user holds the admin role (whatever the view passed)."""
    return is_admin(user)


@register.filter
def as_json(value: Any) -> str:
    """``{{ job.params|as_json }}``: JSON, which the job form takes back (not Python's repr)."""
    return json.dumps(value, sort_keys=True)


@register.filter
def utc_time(value: datetime | None) -> SafeString | str:
    """``{{ key.created_at|utc_time }}``: ``<time datetime="<ISO 8601>">2026-01-02 03:04:05 UTC</time>``,
    to the second and in UTC, as the dashboard's other times are (the GPU map's sample times, the
    model charts; live.js ``Live.time`` writes the same for a socket's times); "" for None."""
    if value is None:
        return ""
    utc = value.astimezone(UTC)
    return format_html(
        '<time datetime="{}">{} UTC</time>', utc.isoformat(), utc.strftime("%Y-%m-%d %H:%M:%S")
    )
