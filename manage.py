#!/usr/bin/env python
"""Django's command-line entry point.

``platform/`` is the Django source root, not a package (``platform`` is a standard-library
module), so it is put on ``sys.path`` here rather than imported as ``platform.config``.
"""

from __future__ import annotations

import os
import sys
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
    except ImproperlyConfigured as exc:  # a bad setting (config/settings.py reads the environment)
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


if __name__ == "__main__":
    main()
