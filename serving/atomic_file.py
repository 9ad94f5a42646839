"""Files written whole or not at all: to a temporary file beside the target, then renamed over it.

A reader (the dashboard polling a counters file, a person opening a benchmark's JSON) never sees a
half-written file, and a run that fails or is interrupted while writing leaves the old file, if
any, as it was.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


def temporary_path(path: Path) -> Path:
    """The temporary file beside ``path`` that ``write_text_atomic`` writes first; its name is
    longer than ``path``'s, so a name near NAME_MAX fits as a target but not as this."""
    # pid and thread: concurrent writers of one path never share a temporary file.
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path``, creating its directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(
    path: str | Path, data: Any, *, indent: int | None = 2, sort_keys: bool = False
) -> None:
    """Write ``data`` as JSON (see ``write_text_atomic``); indented, with a final newline, by default."""
    text = json.dumps(data, indent=indent, sort_keys=sort_keys)
    write_text_atomic(path, text + "\n" if indent is not None else text)
