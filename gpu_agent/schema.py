"""Strict decoding of JSON values into typed dataclasses, used by the wire protocol.

`decode(cls, data, path)` walks the dataclass's resolved type hints and checks every value:
`int` (never a bool), `float` (an int is accepted and widened), `str`, `bool`, `list[X]`,
`dict[str, Any]` (any JSON object), `Literal[...]`, `X | None` and nested dataclasses. Unknown keys
and missing required keys are errors. Every error is a `ProtocolError` whose `field` is the dotted
path of the offending value, e.g. ``devices[2].memory_total_bytes``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

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
    return f"{path}.{name}" if path else name


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
    if not isinstance(data, dict):
        raise ProtocolError(path, f"expected an object, got {type(data).__name__}")
    hints, fields = _layout(cls)  # type: ignore[arg-type]  # classes are hashable
    for key in data:
        if key not in fields:
            raise ProtocolError(_join(path, str(key)), "unknown field")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in data:
            no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if no_default:
                raise ProtocolError(_join(path, name), "required field is missing")
            continue
        kwargs[name] = _value(hints[name], data[name], _join(path, name))
    try:
        return cls(**kwargs)
    except ProtocolError as exc:
        # __post_init__ checks name the field relative to the object; prefix our path.
        raise ProtocolError(_join(path, exc.field), exc.reason) from None


@functools.cache
def _layout(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field[Any]]]:
    """A dataclass's resolved annotations and fields. Resolving string annotations is most of the
    cost of decoding a frame, and frame classes never change, so it is done once per class."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    return typing.get_type_hints(cls), fields


def _value(tp: Any, value: Any, path: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None:
            if type(None) in options:
                return None
            raise ProtocolError(path, "must not be null")
        non_null = [o for o in options if o is not type(None)]
        if len(non_null) != 1:
            raise TypeError(f"unsupported union {tp!r} at {path}")
        return _value(non_null[0], value, path)
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed or isinstance(value, bool):
            raise ProtocolError(path, f"must be one of {', '.join(map(repr, allowed))}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(path, f"expected a list, got {type(value).__name__}")
        (item_tp,) = get_args(tp)
        return [_value(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ProtocolError(path, "expected an object with string keys")
        _, val_tp = get_args(tp)
        return {k: _value(val_tp, v, _join(path, k)) for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return decode(tp, value, path)
    return _scalar(tp, value, path)


def _scalar(tp: Any, value: Any, path: str) -> Any:
    if tp is bool:
        if not isinstance(value, bool):
            raise ProtocolError(path, f"expected a boolean, got {type(value).__name__}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(path, f"expected an integer, got {type(value).__name__}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(path, f"expected a number, got {type(value).__name__}")
        if not math.isfinite(value):
            raise ProtocolError(path, "must be a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ProtocolError(path, f"expected a string, got {type(value).__name__}")
        return value
    raise TypeError(f"unsupported annotation {tp!r} at {path}")


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
