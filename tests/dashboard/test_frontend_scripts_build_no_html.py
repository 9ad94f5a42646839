"""The dashboard's and the playground's scripts build their DOM from elements and text, never from
HTML strings: what a socket frame or an API answer carries must not be parsed as markup. jobs.js
built new job rows with ``innerHTML`` from the id in a frame's key (tests/browser/
test_dashboard_live_frames.py drives that in a browser; this check runs without one)."""

from __future__ import annotations

import re
from pathlib import Path

STATIC = Path(__file__).resolve().parents[2] / "frontend" / "static"
# Sinks that parse a string as HTML.
HTML_SINKS = re.compile(
    r"\.(innerHTML|outerHTML)\s*\+?=|insertAdjacentHTML|document\.write|createContextualFragment"
)


def test_no_script_parses_a_string_as_html() -> None:
    scripts = sorted(STATIC.rglob("*.js"))
    assert STATIC / "dashboard" / "jobs.js" in scripts
    found = [
        f"{path.relative_to(STATIC)}:{number}: {line.strip()}"
        for path in scripts
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if HTML_SINKS.search(line)
    ]
    assert found == []
