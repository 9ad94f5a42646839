"""Ids from URLs, query strings and agent frames are read as ASCII digits of a 64-bit key's length:
one helper (core.ids) for the job apply route, the jobs page and socket, and the agents' frames."""

from __future__ import annotations

import pytest

from core import ids


@pytest.mark.parametrize(
    ("raw", "pk"),
    [
        ("7", 7),
        ("007", 7),  # leading zeros do not count towards the length
        ("9" * 18, int("9" * 18)),
        ("0" * 40 + "5", 5),
        ("9" * 19, None),  # past any 64-bit key
        ("²", None),  # isdigit() takes it, int() does not
        ("٣", None),  # int() takes Arabic-Indic digits; a URL id is ASCII
        ("-1", None),
        ("1.0", None),
        (" 1", None),
        ("", None),
        ("1" * 5000, None),  # int() would refuse it with a ValueError
    ],
)
def test_parse_pk_reads_ascii_digits_of_a_key_s_length(raw: str, pk: int | None) -> None:
    assert ids.parse_pk(raw) == pk


def test_is_digits_takes_long_numbers_but_not_other_scripts() -> None:
    assert ids.is_digits("9" * 40)
    assert not ids.is_digits("²") and not ids.is_digits("٣") and not ids.is_digits("")
