"""Checks of a host's name and address, for the model, forms and the management commands."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.utils.text import slugify

from gpu_agent.address import host_address


def validate_host_address(value: str) -> None:
    """A host name or an IP address, nothing more (see ``gpu_agent.address.host_address``): the
    gateway reaches a replica at ``http://<address>:<port>`` with the port its agent reports."""
    try:
        host_address(value)
    except ValueError as exc:
        raise ValidationError(str(exc), code="invalid") from None


def shown(value: str, limit: int = 60) -> str:
    """``value`` for a message: its repr, cut short (with its length) when it is long."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[: limit - 20]!r}... ({len(value)} characters)"


def host_name_error(name: str) -> str:
    """Why ``name`` cannot be a host's name (the message names it), or "" when it can."""
    from inventory.models import Host  # models import this module

    limit = Host._meta.get_field("name").max_length
    if not name:
        return "host name '' is empty"
    if limit is not None and len(name) > limit:
        return f"host name {shown(name)} is longer than the limit of {limit} characters"
    if slugify(name) != name:
        return f"host name {name!r} must be a slug (lower-case letters, digits, '-', '_')"
    return ""


def host_address_error(address: str) -> str:
    """Why ``address`` cannot be a host's address (the message names it, cut short when it is
    long), or "" when it can. ``host_address`` bounds its length to Host.address's max_length too."""
    try:
        host_address(address)
    except ValueError as exc:
        return str(exc)
    return ""
