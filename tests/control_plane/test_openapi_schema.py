"""The OpenAPI document describes every API view: generating it warns of nothing and it validates."""

from __future__ import annotations

from pathlib import Path

import yaml
from django.core.management import call_command


def test_the_schema_covers_every_view_and_validates(tmp_path: Path) -> None:
    # --fail-on-warn also fails on "unable to guess serializer": a view the document would leave out.
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    paths = yaml.safe_load(out.read_text())["paths"]
    assert "/api/v1/gateway/usage/" in paths
    assert "/api/v1/gateway/latency/{name}/" in paths
