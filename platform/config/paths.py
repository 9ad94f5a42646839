"""Put the Django source root (platform/) and the repository root on ``sys.path``.

Entry points that may be started without them (the ASGI app, the Celery app) call this first.
"""

from __future__ import annotations

import sys
from pathlib import Path

PLATFORM_DIR = Path(__file__).resolve().parents[1]
ROOT_DIR = PLATFORM_DIR.parent


def ensure_source_roots() -> None:
    """Idempotently add platform/ and the repository root to ``sys.path``."""
    for path in (str(ROOT_DIR), str(PLATFORM_DIR)):
        if path not in sys.path:
            sys.path.insert(0, path)
