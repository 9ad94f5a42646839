"""Validators shared by model fields, serializers and management commands."""

from __future__ import annotations

import unicodedata

from django.core.exceptions import ValidationError


def no_control_characters(value: str) -> None:
    """Refuse a control character (Unicode category Cc: newline, tab, ESC, DEL, NUL, ...) in a name
    meant for one line: a newline or an escape sequence in it forges or garbles the lines of lists,
    logs and terminals that show it."""
    at = next((i for i, char in enumerate(value) if unicodedata.category(char) == "Cc"), None)
    if at is not None:
        raise ValidationError(
            "Control characters (newline, tab, escape, ...) are not allowed: %(char)s at index %(at)d.",
            code="control_characters",
            params={"char": repr(value[at]), "at": at},
        )
