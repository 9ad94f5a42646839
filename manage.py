#!/usr/bin/env python
"""Django's command-line entry point.

``platform/`` is the Django source root, not a package (``platform`` is a standard-library
module), so it is put on ``sys.path`` here rather than imported as ``platform.config``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def main() -> None:
    for path in (ROOT / "platform", ROOT):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        if not _raised_by_settings(exc):
            raise  # an app's or a command's own misconfiguration: its traceback is wanted
        # A bad setting: config/settings.py reads the environment (DATABASE_URL=abc, DEBUG=perhaps).
        print(f"manage.py: error: {exc}", file=sys.stderr)
        sys.exit(1)
    except ModuleNotFoundError as exc:  # --settings / DJANGO_SETTINGS_MODULE naming no module
        module = os.environ.get("DJANGO_SETTINGS_MODULE", "")
        if not exc.name or not (module == exc.name or module.startswith(f"{exc.name}.")):
            raise  # an import inside the project: a bug, whose traceback is wanted
        print(
            f"manage.py: error: settings module {module!r} (--settings) cannot be imported: {exc}",
            file=sys.stderr,
        )
        sys.exit(1)


def _raised_by_settings(exc: BaseException) -> bool:
    """Whether ``exc`` came out of the settings module's own code (it is among the frames)."""
    try:
        spec = importlib.util.find_spec(os.environ.get("DJANGO_SETTINGS_MODULE", ""))
    except (ImportError, ValueError):
        return False
    origin = spec.origin if spec is not None else None
    return origin is not None and any(f.filename == origin for f in traceback.extract_tb(exc.__traceback__))


if __name__ == "__main__":
    main()
