"""The latency summary's figures: linearly interpolated percentiles (as serving.metrics), the mean
gap per request named TPOT, a TBT figure from each request's largest gap to compare with the TBT SLO,
and the old keys kept as documented, deprecated aliases."""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from accounts.models import User
from accounts.services import issue_api_token
from django.core.management import call_command
from django.utils import timezone
from gateway.models import RequestSample
from gateway.services import latency_summary
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def client_of(user: User) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issue_api_token(user, 't').plaintext}")
    return client


def add_samples(model: Any, rows: list[tuple[float | None, float | None, float | None]]) -> None:
    now = timezone.now()
    for i, (ttft, mean_gap, max_gap) in enumerate(rows):
        RequestSample.objects.create(
            model=model,
            ts=now - timedelta(seconds=len(rows) - i),
            stream=mean_gap is not None,
            outcome="completed",
            ttft_s=ttft,
            tbt_mean_s=mean_gap,
            tbt_max_s=max_gap,
        )


def test_it_interpolates_percentiles_linearly_as_serving_metrics_does(gateway_data: dict[str, Any]) -> None:
    rng = random.Random(7)
    ttfts = [round(rng.uniform(0.05, 2.0), 4) for _ in range(37)]
    add_samples(gateway_data["model"], [(t, None, None) for t in ttfts])
    summary = latency_summary(gateway_data["model"])
    assert summary["ttft_p50_s"] == pytest.approx(float(np.percentile(ttfts, 50)))
    assert summary["ttft_p99_s"] == pytest.approx(float(np.percentile(ttfts, 99)))
    # four samples: the median lies between the middle two, not on the upper one (floor rank)
    RequestSample.objects.all().delete()
    add_samples(gateway_data["model"], [(t, None, None) for t in (0.1, 0.2, 0.3, 0.4)])
    summary = latency_summary(gateway_data["model"])
    assert summary["ttft_p50_s"] == pytest.approx(0.25) and summary["ttft_p99_s"] == pytest.approx(0.397)
    assert summary["tpot_p99_s"] is None and summary["tbt_max_p99_s"] is None, "no streamed requests"


def test_it_holds_the_largest_gaps_against_the_tbt_slo_not_the_mean_gaps(
    gateway_data: dict[str, Any],
) -> None:
    # 100 streamed requests at 20 ms per token on average; 5 of them stalled for a second once
    rows: list[tuple[float | None, float | None, float | None]] = [
        (0.1, 0.02, 1.0 if i % 20 == 0 else 0.03) for i in range(100)
    ]
    add_samples(gateway_data["model"], [*rows, (0.1, None, None)])  # and one unstreamed request
    summary = latency_summary(gateway_data["model"])
    assert summary["requests"] == 101
    assert summary["tbt_slo_s"] == 0.05
    assert summary["tpot_p50_s"] == pytest.approx(0.02) and summary["tpot_p99_s"] == pytest.approx(0.02)
    # the stalls break the 50 ms TBT target for 5% of requests: the TBT figure shows it
    assert summary["tbt_max_p99_s"] == pytest.approx(1.0)
    tbt, slo, tpot = (summary[k] for k in ("tbt_max_p99_s", "tbt_slo_s", "tpot_p99_s"))
    assert isinstance(tbt, float) and isinstance(slo, float) and isinstance(tpot, float)
    assert tbt > slo > tpot
    # the old keys stay, with the value they always held (the mean gap), for older clients
    assert (summary["tbt_p50_s"], summary["tbt_p99_s"]) == (summary["tpot_p50_s"], summary["tpot_p99_s"])


def test_the_api_serves_the_figures_and_its_schema_documents_them(
    gateway_data: dict[str, Any], tmp_path: Path
) -> None:
    add_samples(gateway_data["model"], [(0.2, 0.01, 0.04), (0.4, 0.03, 0.2)])
    body = client_of(gateway_data["user"]).get("/api/v1/gateway/latency/tiny/").json()
    summary = body["summary"]
    assert summary["tpot_p50_s"] == pytest.approx(0.02)
    assert summary["tbt_max_p99_s"] == pytest.approx(0.04 + 0.99 * 0.16)
    assert summary["tbt_p99_s"] == summary["tpot_p99_s"]
    assert [(r["tbt_mean_s"], r["tbt_max_s"]) for r in body["requests"]] == [(0.01, 0.04), (0.03, 0.2)]

    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    fields = yaml.safe_load(out.read_text())["components"]["schemas"]["LatencySummary"]["properties"]
    assert set(fields) == set(summary)
    assert fields["tbt_p99_s"]["deprecated"] and fields["tbt_p50_s"]["deprecated"]
    assert "tpot_p99_s" in fields["tbt_p99_s"]["description"]
    assert "tbt_slo_s" in fields["tbt_max_p99_s"]["description"]
    assert not fields["tbt_max_p99_s"].get("deprecated")
