"""Template filters for pages built on dashboard/base.html (also other apps' pages, e.g. the playground)."""

from __future__ import annotations

import json
from typing import Any

from accounts.roles import is_admin
from django import template

register = template.Library()


@register.filter
def platform_admin(user: Any) -> bool:
    """``{% if user|platform_admin %}``: the user holds the admin role (whatever the view passed)."""
    return is_admin(user)


@register.filter
def as_json(value: Any) -> str:
    """``{{ job.params|as_json }}``: JSON, which the job form takes back (not Python's repr)."""
    return json.dumps(value, sort_keys=True)
