"""Strict decoding of JSON values into typed dataclasses, used by the wire protocol.

`decode(cls, data, path)` checks every value against the dataclass's resolved type hints, with
a decoder built once per class (see `_decoder`; telemetry frames arrive many times a second):
`int` (never a bool), `float` (an int is accepted and widened), `str`, `bool`, `list[X]`,
`dict[str, Any]` (any JSON object), `Literal[...]`, `X | None` and nested dataclasses. Unknown keys
and missing required keys are errors. Integers must fit in a signed 64-bit integer, floats must
be finite, and strings (and object keys) must not contain NUL (U+0000) or a lone surrogate (U+D800
to U+DFFF, what JSON's "\\ud800" escape without its pair decodes to): the receiver stores them in
database columns and builds datetimes from them, where such a value raises far from the parser (an
`OverflowError` in the database driver; PostgreSQL refuses NUL in text and jsonb, and no UTF-8
text, so no database, holds a lone surrogate: encoding it raised UnicodeEncodeError). Every
error is a `ProtocolError` whose `field` is the dotted path of the offending value, e.g.
``devices[2].memory_total_bytes``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

T = TypeVar("T")


class ProtocolError(ValueError):
    """A frame that does not follow the protocol.

    Attributes:
        field: Dotted path of the offending field ("" for the frame itself).
        reason: What is wrong with it.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field or 'frame'}: {reason}")


def _join(path: str, name: str) -> str:
    """``path`` + a field below it: ``a.b``, or ``a[3]`` when ``name`` is a list index ``[3]``."""
    if not path:
        return name
    if not name:
        return path
    return f"{path}{name}" if name.startswith("[") else f"{path}.{name}"


def decode(cls: type[T], data: Any, path: str = "") -> T:
    """Build dataclass `cls` from the JSON object `data`, validating every field.

    Args:
        cls: A dataclass type whose fields use the supported annotations.
        data: A value decoded from JSON.
        path: Dotted path of `data` inside the frame, for error messages.

    Returns:
        An instance of `cls`.

    Raises:
        ProtocolError: naming the first bad field.
    """
    try:
        return _decoder(cls)(data)  # type: ignore[arg-type]  # classes are hashable
    except ProtocolError as exc:
        if not path:
            raise
        raise ProtocolError(_join(path, exc.field), exc.reason) from None


# A decoder checks one JSON value against one annotation and returns the Python value. It raises
# ProtocolError with `field` relative to the value ("" for the value itself); the decoder of the
# enclosing object or list puts the field name or index in front. Paths are thus only built for
# the one value that is wrong, not for every value of every frame.
Decoder = Callable[[Any], Any]


@functools.cache
def _decoder(tp: Any) -> Decoder:
    """The decoder of annotation `tp`, built once per annotation (frame classes never change)."""
    origin = get_origin(tp)
    if tp is Any:
        return _identity
    if origin in (Union, types.UnionType):
        return _optional_decoder(tp)
    if origin is Literal:
        return _literal_decoder(get_args(tp))
    if origin is list:
        return _list_decoder(_decoder(get_args(tp)[0]))
    if origin is dict:
        return _dict_decoder(_decoder(get_args(tp)[1]))
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _object_decoder(tp)
    scalar = _SCALARS.get(tp)
    if scalar is None:
        raise TypeError(f"unsupported annotation {tp!r}")
    return scalar


def _identity(value: Any) -> Any:
    return value


def _optional_decoder(tp: Any) -> Decoder:
    options = get_args(tp)
    non_null = [o for o in options if o is not type(None)]
    if len(non_null) != 1:
        raise TypeError(f"unsupported union {tp!r}")
    inner = _decoder(non_null[0])
    nullable = type(None) in options

    def optional(value: Any) -> Any:
        if value is None:
            if nullable:
                return None
            raise ProtocolError("", "must not be null")
        return inner(value)

    return optional


def _literal_decoder(allowed: tuple[Any, ...]) -> Decoder:
    def literal(value: Any) -> Any:
        if value not in allowed or isinstance(value, bool):
            raise ProtocolError("", f"must be one of {', '.join(map(repr, allowed))}, got {value!r}")
        return value

    return literal


def _list_decoder(item: Decoder) -> Decoder:
    def list_of(value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise ProtocolError("", f"expected a list, got {type(value).__name__}")
        out = []
        for i, v in enumerate(value):
            try:
                out.append(item(v))
            except ProtocolError as exc:
                raise ProtocolError(_join(f"[{i}]", exc.field), exc.reason) from None
        return out

    return list_of


def _dict_decoder(item: Decoder) -> Decoder:
    def dict_of(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ProtocolError("", "expected an object with string keys")
        out = {}
        for k, v in value.items():
            unfit = _unfit_text(k)
            if unfit:
                raise ProtocolError("", unfit)
            try:
                out[k] = item(v)
            except ProtocolError as exc:
                raise ProtocolError(_join(k, exc.field), exc.reason) from None
        return out

    return dict_of


def _object_decoder(cls: type) -> Decoder:
    # Resolving string annotations (get_type_hints) is costly: done here, once per class.
    hints = typing.get_type_hints(cls)
    specs = []
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        specs.append((f.name, required, _decoder(hints[f.name])))
    names = frozenset(name for name, _, _ in specs)

    def obj(data: Any) -> Any:
        if not isinstance(data, dict):
            raise ProtocolError("", f"expected an object, got {type(data).__name__}")
        if not names.issuperset(data):
            unknown = next(key for key in data if key not in names)
            raise ProtocolError(without_nul(str(unknown)), "unknown field")
        kwargs: dict[str, Any] = {}
        for name, required, field_decoder in specs:
            if name in data:
                try:
                    kwargs[name] = field_decoder(data[name])
                except ProtocolError as exc:
                    raise ProtocolError(_join(name, exc.field), exc.reason) from None
            elif required:
                raise ProtocolError(name, "required field is missing")
        # __post_init__ checks raise ProtocolError naming the field relative to the object.
        return cls(**kwargs)

    return obj


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError("", f"expected a boolean, got {type(value).__name__}")
    return value


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _int(value: Any) -> int:
    # the common case first; bool is a subclass of int, not int itself
    if type(value) is int and INT64_MIN <= value <= INT64_MAX:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError("", f"expected an integer, got {type(value).__name__}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise ProtocolError("", f"must fit in a signed 64-bit integer, got {value!r}")
    return value


def _float(value: Any) -> float:
    if type(value) is float and math.isfinite(value):  # the common case first
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError("", f"expected a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ProtocolError("", "must be a finite number")
    return float(value)


NUL_REASON = "must not contain a NUL character (U+0000)"
SURROGATE_REASON = "must not contain a lone surrogate (U+D800 to U+DFFF, half of a UTF-16 pair)"
# What no frame's string may hold: NUL, and a surrogate code point (a pair decodes to the one
# character it encodes, so one left in a decoded string is a lone half).
_UNFIT = re.compile("[\x00\ud800-\udfff]")


def _unfit_text(value: str) -> str:
    """Why ``value`` cannot be a string of a frame (`NUL_REASON`, `SURROGATE_REASON`), or ""."""
    if _UNFIT.search(value) is None:
        return ""
    return NUL_REASON if "\x00" in value else SURROGATE_REASON


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ProtocolError("", f"expected a string, got {type(value).__name__}")
    unfit = _unfit_text(value)
    if unfit:  # the message never echoes the value: it would carry the character back
        raise ProtocolError("", unfit)
    return value


def without_nul(text: str) -> str:
    """``text`` with every NUL and lone surrogate replaced by U+FFFD, for text a sender takes from
    elsewhere (an engine's log lines, an exception's message, which names a file by its bytes
    decoded with surrogateescape) before it puts it in a frame the peer would refuse."""
    return _UNFIT.sub("\ufffd", text)


_SCALARS: dict[Any, Decoder] = {bool: _bool, int: _int, float: _float, str: _str}


def encode(obj: Any) -> Any:
    """A dataclass (and whatever it holds) as JSON-ready dicts/lists/scalars."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [encode(v) for v in obj]
    if isinstance(obj, dict):
        return {k: encode(v) for k, v in obj.items()}
    return obj


def check(condition: bool, field: str, reason: str) -> None:
    """Raise ProtocolError(field, reason) unless `condition`; for `__post_init__` range checks."""
    if not condition:
        raise ProtocolError(field, reason)


# ---- value ranges the control plane stores (protocol.py's frames check them) ---------------------

# Device indices are stored as small integers (16-bit columns) by the control plane.
MAX_DEVICE_INDEX = 2**15 - 1
# Per-window latency counts, queue lengths and restart counters are stored in 32-bit columns.
MAX_COUNT = 2**31 - 1
# `ts` is seconds since the epoch, before 2106-02-07: every sane clock, and any datetime can hold it.
MAX_TS = float(2**32)


def non_negative(obj: Any, *names: str) -> None:
    # Telemetry runs this for every sample: the message is only formatted for a bad value.
    for name in names:
        value = getattr(obj, name)
        if value is not None and value < 0:
            raise ProtocolError(name, f"must be >= 0, got {value!r}")


def at_most(obj: Any, high: int, *names: str) -> None:
    # Integers stored in narrow columns: 0..high (None passes, like in non_negative).
    for name in names:
        value = getattr(obj, name)
        if value is not None and not 0 <= value <= high:
            raise ProtocolError(name, f"must be in 0..{high}, got {value!r}")


def at_most_chars(obj: Any, high: int, *names: str) -> None:
    # Strings stored in columns of `high` characters (a longer one is a database error).
    for name in names:
        value = getattr(obj, name)
        if value is not None and len(value) > high:
            raise ProtocolError(name, f"must be at most {high} characters, got {len(value)}")


def timestamp(ts: float) -> None:
    if not 0 <= ts < MAX_TS:
        raise ProtocolError("ts", f"must be seconds since the epoch in [0, 2**32), got {ts!r}")


# ---- frames ------------------------------------------------------------------------------------

PROTOCOL_VERSION = 1

Sender = Literal["agent", "control_plane"]


class Frame:
    """Base of every frame type. `TYPE` is the "type" tag; `SENDERS` who may send it."""

    TYPE: ClassVar[str]
    SENDERS: ClassVar[tuple[Sender, ...]]

    def to_dict(self) -> dict[str, Any]:
        """The frame as a JSON-ready object, with "v" and "type"."""
        return {"v": PROTOCOL_VERSION, "type": self.TYPE, **encode(self)}
