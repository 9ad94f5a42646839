"""Database ids as they arrive in URLs, query strings and agent frames: ASCII digits only.

``str.isdigit`` alone takes '²' (which ``int()`` refuses) and ``int()`` takes the digits of other
scripts ('٣'), so both checks are needed; a number of more than ``MAX_DIGITS`` significant digits is
past any 64-bit primary key (the database driver would overflow on it, and ``int()`` refuses strings
of over 4300 digits).
"""

from __future__ import annotations

MAX_DIGITS = 18


def is_digits(raw: str) -> bool:
    """Whether ``raw`` is written in ASCII digits only (and is not empty)."""
    return raw.isascii() and raw.isdigit()


def parse_pk(raw: str) -> int | None:
    """The number ``raw`` writes in ASCII digits, or None when it is anything else or too long to be
    a primary key."""
    if not is_digits(raw) or len(raw.lstrip("0")) > MAX_DIGITS:
        return None
    return int(raw)
