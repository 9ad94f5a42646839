"""JSON as RFC 8259 defines it, and no more.

Python's ``json`` also reads ``NaN``, ``Infinity`` and numbers past a float (``1e400`` becomes
``inf``); no client's JSON parser takes them back, and PostgreSQL's jsonb refuses them. ``loads``
raises `NotFinite` for them, as the REST API's parser (DRF, STRICT_JSON) refuses them in bodies. Used
for the dashboard's JSON textareas and the engines' answers the gateway relays.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any


class NotFinite(ValueError):
    """A NaN, an Infinity or a number past a float; the message is the number as written."""


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise NotFinite(text)
    return number


def _no_constant(name: str) -> Any:
    raise NotFinite(name)


# One decoder for every call: json.loads with these hooks would build one per call (~10 us).
_DECODER = json.JSONDecoder(parse_float=_finite, parse_constant=_no_constant)


def loads(text: str | bytes) -> Any:
    """``text`` (bytes as UTF-8) decoded as strict JSON.

    Raises:
        NotFinite: a non-finite number; json.JSONDecodeError: no JSON; ValueError: invalid UTF-8
            or an integer of more digits than int() reads (4300); RecursionError: nested too deep.
    """
    return _DECODER.decode(text.decode() if isinstance(text, bytes) else text)


# A surrogate code point (U+D800 to U+DFFF) in a decoded string: JSON's "\ud800" escape without
# its pair decodes to one (a pair decodes to the one character it encodes). No UTF-8 text holds
# one: PostgreSQL refuses it (in text and jsonb), and encoding a response that echoes it fails.
_SURROGATE = re.compile("[\ud800-\udfff]")


def json_strings(value: Any) -> Iterator[str]:
    """Every string of a decoded JSON value: its keys and string values, at any depth."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def lone_surrogate(value: Any) -> str | None:
    """A lone surrogate of a decoded JSON value (in a key or a string, at any depth) as its escape
    (``"\\ud800"``), or None when it has none."""
    for text in json_strings(value):
        found = _SURROGATE.search(text)
        if found:
            return f"\\u{ord(found.group()):04x}"
    return None
