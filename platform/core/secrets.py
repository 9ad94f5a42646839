"""Random bearer secrets that are stored only as digests.

A secret is ``<kind>_<32 random bytes, url-safe>``; the database keeps its SHA-256 hex digest and
a short display prefix. Secrets carry 256 bits of entropy, so a fast hash is enough (a password
hasher's work factor only matters for guessable inputs); lookups are by digest, an indexed exact
match.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

PREFIX_LENGTH = 12


@dataclass(frozen=True)
class IssuedSecret:
    """A freshly generated secret: ``plaintext`` is shown once and never stored."""

    plaintext: str
    prefix: str
    digest: str


@dataclass(frozen=True)
class Issued:
    """A stored credential row and its plaintext, which exists only in this object."""

    record: Any
    plaintext: str


def digest_secret(plaintext: str) -> str:
    """The stored form of a secret."""
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def issue_secret(kind: str) -> IssuedSecret:
    """Generate a new secret of ``kind`` (e.g. ``"sk"`` for end-user API keys)."""
    if not kind.isalnum():
        raise ValueError(f"{kind=} must be alphanumeric")
    plaintext = f"{kind}_{secrets.token_urlsafe(32)}"
    return IssuedSecret(
        plaintext=plaintext, prefix=plaintext[:PREFIX_LENGTH], digest=digest_secret(plaintext)
    )
