"""The local SECRET_KEY: generated once into var/ and reused, never committed."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

MIN_LENGTH = 50


def load_or_create_secret_key(path: Path) -> str:
    """Return the key stored at ``path``, creating it (mode 0600) on first use.

    Creation uses ``O_EXCL`` so that two processes starting together (web + worker) cannot
    write different keys: the loser of the race reads the winner's file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_text().strip()
        if len(key) < MIN_LENGTH:
            raise ImproperlyConfigured(
                f"{path} holds a key shorter than {MIN_LENGTH} characters; delete it to regenerate"
            ) from None
        return key
    key = secrets.token_urlsafe(64)
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    return key
