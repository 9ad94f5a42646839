"""The OpenAPI document describes every API view: generating it warns of nothing and it validates."""

from __future__ import annotations

from pathlib import Path

import yaml
from django.core.management import call_command


def test_the_schema_covers_every_view_and_validates(tmp_path: Path) -> None:
    # --fail-on-warn also fails on "unable to guess serializer": a view the document would leave out.
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    schema = yaml.safe_load(out.read_text())
    paths = schema["paths"]
    assert "/api/v1/gateway/usage/" in paths
    assert "/api/v1/gateway/latency/{name}/" in paths
    # A job the broker does not take is a 503 with Retry-After and a detail (BrokerUnavailable).
    refused = paths["/api/v1/jobs/"]["post"]["responses"]["503"]
    assert refused["headers"]["Retry-After"]["schema"] == {"type": "integer"}
    body = refused["content"]["application/json"]["schema"]["$ref"].removeprefix("#/components/schemas/")
    assert schema["components"]["schemas"][body]["properties"] == {"detail": {"type": "string"}}
    # A DELETE refused with 409 declares it, with its detail: a model deployments still refer to
    # (ProtectedError, mapped by core.api.errors; the document listed only 204), a running deployment.
    for path in ("/api/v1/models/{id}/", "/api/v1/deployments/{id}/"):
        responses = paths[path]["delete"]["responses"]
        assert set(responses) == {"204", "409"}, (path, sorted(responses))
        ref = responses["409"]["content"]["application/json"]["schema"]["$ref"]
        assert schema["components"]["schemas"][ref.split("/")[-1]]["properties"] == {
            "detail": {"type": "string"}
        }
    # A job that has finished cannot be cancelled, a stale plan not applied: their 409s have a
    # detail too (they were listed bare).
    for path, codes in (
        ("/api/v1/jobs/{id}/cancel/", {"200", "400", "409"}),
        ("/api/v1/plans/{job}/apply/", {"200", "400", "404", "409"}),
    ):
        responses = paths[path]["post"]["responses"]
        assert set(responses) == codes, (path, sorted(responses))
        ref = responses["409"]["content"]["application/json"]["schema"]["$ref"]
        assert schema["components"]["schemas"][ref.split("/")[-1]]["properties"] == {
            "detail": {"type": "string"}
        }
    # Hosts are read-only in the API: no DELETE, so no 409 to declare.
    assert "delete" not in paths["/api/v1/hosts/{id}/"]
