"""Host addresses: the one check of what the control plane builds an engine's URL from.

Used by the agent's --address and --engine-bind (gpu_agent.config), a `register` frame's `address`
(gpu_agent.protocol) and the control plane's Host.address (inventory.validators). Standard library
only: the control plane imports it too.
"""

from __future__ import annotations

import ipaddress
import re

# The longest `address` a `register` may carry: the control plane stores it in Host.address, a
# column of this many characters (inventory.models; tests/fleet/test_register_address.py keeps the
# two equal: this module cannot import Django). A longer value is a database error on PostgreSQL.
MAX_ADDRESS_LENGTH = 255
# One label of a host name: ASCII letters, digits, '-' (not at either end) and '_' (container and
# compose service names use it; httpx and the resolver accept it), 1..63 characters.
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
MAX_HOST_NAME = 253  # characters of a DNS name, without the trailing dot


def host_address(text: str, *, unspecified_ok: bool = False) -> str:
    """``text`` as a host address: a host name, an IPv4 address or an IPv6 address (brackets
    optional; returned without them). That is what the control plane builds an engine's URL from
    (``http://<address>:<port>``, IPv6 bracketed, the port the agent's engine reports) and what
    engines bind: a port, a scheme or a path in it would make every URL built from it wrong.
    The one check of an address: the agent's --address and --engine-bind (gpu_agent.config), a
    `register` frame's `address` and the control plane's Host.address (inventory.validators).

    Args:
        text: The value given.
        unspecified_ok: Accept 0.0.0.0 and :: (a bind address, not one to be reached on).

    Raises:
        ValueError: why ``text`` is not one; the message names it (cut short when it is long).
    """
    why = address_problem(text, unspecified_ok)
    if why:
        raise ValueError(f"{quoted(text)} {why}")
    return text[1:-1] if text.startswith("[") else text


def quoted(text: str, limit: int = 60) -> str:
    """``text``'s repr for a message, cut short (with its length) when it is long: an error frame
    must not echo a peer's whole oversized value back to it."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[: limit - 20]!r}... ({len(text)} characters)"


def address_problem(text: str, unspecified_ok: bool) -> str:
    """Why ``text`` is not a host address (a phrase to follow its repr), or "" when it is one."""
    alone = "give the host name or IP address alone"
    if len(text) > MAX_ADDRESS_LENGTH:
        return f"is longer than the limit of {MAX_ADDRESS_LENGTH} characters"
    if not text.strip():
        return "is empty"
    if any(c.isspace() for c in text):
        return "contains whitespace"
    if "://" in text or "/" in text:
        return f"is a URL or path, not a host address; {alone} (the agent picks engine ports)"
    bracketed = re.fullmatch(r"\[([^\]]*)\]", text)
    if bracketed is None and text.startswith("[") and "]" not in text:
        return "has an unclosed '['"
    if bracketed is None and (text.startswith("[") or text.count(":") == 1):
        return f"looks like HOST:PORT; {alone} (the agent picks engine ports)"
    bare = bracketed.group(1) if bracketed else text
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        ip = None
    if ip is None and (bracketed or ":" in bare):
        return "is not an IPv6 address" if "%" not in bare else "has an IPv6 zone id (%...)"
    if ip is not None:
        if bracketed and ip.version == 4:
            return "has brackets, which are for IPv6 addresses only"
        if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
            return "has an IPv6 zone id (%...): it names a network interface of one machine only"
        if ip.is_unspecified and not unspecified_ok:
            return "is the unspecified address: nothing can be reached on it; give this host's IP or name"
        return ""
    name = text[:-1] if text.endswith(".") else text
    if len(name) > MAX_HOST_NAME:
        return f"is too long: a host name has at most {MAX_HOST_NAME} characters"
    labels = name.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return "is not a host name (ASCII letters, digits, '-', '_' and '.') or an IP address"
    if labels[-1].isdigit():
        return "is not an IP address (and a host name's last label is not all digits)"
    return ""
