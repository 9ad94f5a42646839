"""``GET /api/v1/metrics/``: what the dashboard shows, in Prometheus' text format.

Operators alert and keep long histories in their own monitoring; this gives it the fleet the
dashboard shows: hosts up, each GPU's memory (used, free, lent, borrowed) and Aqua role, each
deployment's state, each engine's latest telemetry window (TTFT and TBT p50/p99, requests running
and waiting, KV cache usage, preemptions, bytes offloaded), each model's SLO attainment over the
last minute, and jobs by kind and status.

Read from the database at each scrape with the dashboard's own functions (dashboard/snapshots.py),
so every ASGI process answers the same and the figures match the pages; nothing is kept between
scrapes, and a scrape costs a fixed number of queries whatever the fleet's size. Figures are
exported while current (`Freshness`: the host online, the dashboard's host badge, and the sample
or window younger than ``FRESH`` or the host's stale time, for an agent that reports less often):
an engine without a current window is left out rather than repeated as current, and so are a
device's readings (memory used, free, lent and borrowed, utilisation) without a current sample:
its total is kept and its role reads none, as for a device never sampled. The
engines' preemption and offload counts are counters: they restart from zero with their engine,
which Prometheus' rate() handles as a counter reset.

Authentication is the API's (``Authorization: Token <token>`` or ``Bearer``; any platform role):
Prometheus sends it with ``authorization: {credentials: <token>}`` in the scrape config.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any

from agents import history
from agents.models import EngineSample
from deployments.models import Deployment
from django.db.models import Count
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from inventory.models import Host, HostStatus
from inventory.services import stale_after_s
from jobs.models import Job
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from registry.models import ServedModel
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from dashboard import snapshots

PREFIX = "llmp"
# An engine window or device sample older than this (or than its host's stale time) is not
# reported: its engine or agent stopped reporting and its last figures are not current.
FRESH = timedelta(seconds=60)


class Freshness:
    """Whether a host's device sample or engine window is current, one rule for both: the host is
    online and the figure younger than ``FRESH`` or the host's stale time, whichever is longer. An
    agent reports every heartbeat interval (up to a minute): its newest figure may be as old as the
    host may stay silent and still be online; with a fixed minute an agent reporting each minute
    lost its figures for the second half of every minute."""

    def __init__(self, snap: snapshots.Snapshot) -> None:
        self.now = timezone.now()
        # host pk -> whether the dashboard shows it online
        self.online = {
            int(key.split(":")[1]): host["status"] == HostStatus.ONLINE
            for key, host in snap.items()
            if key.startswith("host:")
        }
        # host pk -> how old its figures may be
        self.within = {
            pk: max(FRESH, timedelta(seconds=stale_after_s(beat)))
            for pk, beat in Host.objects.values_list("pk", "heartbeat_interval_s")
        }

    def since(self) -> datetime:
        """The oldest time any host's figures may be current from."""
        return self.now - max(self.within.values(), default=FRESH)

    def current(self, host_pk: int, ts: datetime | None) -> bool:
        return (
            ts is not None
            and self.online.get(host_pk, False)
            and self.now - ts < self.within.get(host_pk, FRESH)
        )


class FleetCollector(Collector):
    """One scrape's metric families, read when ``collect()`` is called."""

    def collect(self) -> Iterator[Metric]:
        snap = snapshots.overview()
        fresh = Freshness(snap)
        yield from _hosts(snap)
        yield from _gpus(snap, fresh)
        deployments = list(Deployment.objects.select_related("model", "host").order_by("pk"))
        yield from _deployments(deployments)
        yield from _engines(deployments, fresh)
        yield from _jobs()


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)


def _hosts(snap: snapshots.Snapshot) -> Iterator[Metric]:
    up = _gauge("host_up", "1 while the host's agent is online (0 stale or offline)", ["host"])
    for key, host in snap.items():
        if key.startswith("host:"):
            up.add_metric([host["name"]], 1.0 if host["status"] == HostStatus.ONLINE else 0.0)
    yield up


def _gpus(snap: snapshots.Snapshot, fresh: Freshness) -> Iterator[Metric]:
    # gpu: the device's index; kind: gpu, or cpu (a CPU host's one device)
    labels = ["host", "gpu", "name", "kind"]
    memory = {
        field: _gauge(f"gpu_memory_{field}_bytes", f"GPU memory {field} (latest sample)", labels)
        for field in ("total", "used", "free", "lent", "borrowed")
    }
    utilization = _gauge("gpu_utilization_ratio", "GPU utilisation, 0 to 1 (latest sample)", labels)
    role = _gauge(
        "gpu_aqua_role", "1 for the device's Aqua role: producer, consumer or none", [*labels, "role"]
    )
    hosts = {int(key.split(":")[1]): host for key, host in snap.items() if key.startswith("host:")}
    for key, card in snap.items():
        if not key.startswith("device:"):
            continue
        host = hosts[card["host"]]
        values = [host["name"], str(card["index"]), card["name"], card["kind"]]
        # A current reading: without a sample, used 0 / free total is no reading; with one from a
        # host that is down (stale or offline) or an old one, the figures are not today's.
        ts = None if card["ts"] is None else datetime.fromisoformat(card["ts"])
        current = fresh.current(card["host"], ts)
        if card["total"]:  # 0: the GPU reports no memory of its own (unified memory), nothing to show
            memory["total"].add_metric(values, float(card["total"]))
            if current:
                for field in ("used", "free", "lent", "borrowed"):
                    memory[field].add_metric(values, float(card[field]))
        if current and card["utilization"] is not None:
            utilization.add_metric(values, card["utilization"] / 100.0)
        role.add_metric([*values, card["role"] if current else "none"], 1.0)
    yield from memory.values()
    yield utilization
    yield role


def _deployments(deployments: list[Deployment]) -> Iterator[Metric]:
    info = _gauge(
        "deployment_info",
        "1 per deployment, with its model, host and states",
        ["deployment", "model", "host", "desired", "observed"],
    )
    for d in deployments:
        info.add_metric([str(d.pk), d.model.name, d.host.name, d.desired_state, d.observed_state], 1.0)
    yield info


def _engines(deployments: list[Deployment], fresh: Freshness) -> Iterator[Metric]:
    by_pk = {d.pk: d for d in deployments}
    rows = (
        EngineSample.objects.filter(deployment_id__in=list(by_pk), ts__gt=fresh.since())
        .order_by("deployment_id", "ts", "pk")
        .values("deployment_id", *history.ENGINE_RAW_FIELDS)
    )
    newest: dict[int, dict[str, Any]] = {}  # deployment pk -> its newest current window
    windows: dict[int, list[dict[str, Any]]] = {}  # model pk -> every current window of its engines
    for row in rows:
        deployment = by_pk[row["deployment_id"]]
        if not fresh.current(deployment.host_id, row["ts"]):
            continue
        newest[deployment.pk] = row
        windows.setdefault(deployment.model_id, []).append(
            {"ts": row["ts"].isoformat(), "ttft_p99": row["ttft_p99"], "tbt_p99": row["itl_p99"]}
        )
    labels = ["deployment", "model"]
    ttft = _gauge(
        "engine_ttft_seconds", "time to first token in the engine's latest window", [*labels, "quantile"]
    )
    tbt = _gauge(
        "engine_tbt_seconds", "time between tokens in the engine's latest window", [*labels, "quantile"]
    )
    running = _gauge("engine_requests_running", "requests the engine is running", labels)
    waiting = _gauge("engine_requests_waiting", "requests waiting in the engine", labels)
    kv = _gauge("engine_kv_cache_usage_ratio", "share of the KV cache in use, 0 to 1", labels)
    preemptions = CounterMetricFamily(
        f"{PREFIX}_engine_preemptions", "requests preempted by the engine", labels=labels
    )
    offloaded = CounterMetricFamily(
        f"{PREFIX}_engine_offloaded_bytes", "KV bytes offloaded (Aqua)", labels=labels
    )
    for pk, last in newest.items():
        values = [str(pk), by_pk[pk].model.name]
        for family, prefix in ((ttft, "ttft"), (tbt, "itl")):
            for quantile, field in (("0.5", f"{prefix}_p50"), ("0.99", f"{prefix}_p99")):
                if last[field] is not None:
                    family.add_metric([*values, quantile], last[field])
        running.add_metric(values, last["running"])
        waiting.add_metric(values, last["waiting"])
        if last["kv_cache_usage"] is not None:
            kv.add_metric(values, last["kv_cache_usage"])
        preemptions.add_metric(values, last["preemptions_total"])
        offloaded.add_metric(values, last["bytes_offloaded"])
    yield from (ttft, tbt, running, waiting, kv, preemptions, offloaded)
    yield _attainment(windows)


def _attainment(by_model: dict[int, list[dict[str, Any]]]) -> Metric:
    family = _gauge(
        "model_slo_attainment_ratio",
        "share of the last minute's telemetry windows that met the model's TTFT and TBT SLOs, 0 to 1",
        ["model"],
    )
    for model in ServedModel.objects.filter(pk__in=list(by_model)).order_by("name"):
        share = snapshots.attainment(model, by_model[model.pk])
        if share is not None:
            family.add_metric([model.name], share / 100.0)
    return family


def _jobs() -> Iterator[Metric]:
    family = _gauge("jobs", "jobs by kind and status", ["kind", "status"])
    rows = Job.objects.values("kind", "status").annotate(n=Count("pk")).order_by("kind", "status")
    for row in rows:
        family.add_metric([row["kind"], row["status"]], row["n"])
    yield family


def fleet_metrics() -> bytes:
    """The fleet in Prometheus' text exposition format (version 0.0.4)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return generate_latest(registry)


class TextWhateverAccepted(BaseContentNegotiation):
    """The answer is the text format (errors: JSON) whatever the scraper's Accept header says.

    DRF's negotiation matches Accept against the view's renderers (JSON, the browsable API) and
    answered 406 to a scraper that asks for the text format only: Telegraf's prometheus input
    (protobuf or ``text/plain;version=0.0.4``), ``curl -H 'Accept: text/plain'``."""

    def select_parser(self, request: Request, parsers: Iterable[BaseParser]) -> BaseParser | None:
        return next(iter(parsers), None)

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type


class PrometheusView(APIView):
    """``GET /api/v1/metrics/``: the fleet's metrics for Prometheus (any platform role)."""

    content_negotiation_class = TextWhateverAccepted
    renderer_classes = [JSONRenderer]  # for errors (401, 403); the metrics are a plain response

    @extend_schema(responses={(200, "text/plain"): OpenApiResponse(OpenApiTypes.STR)})
    def get(self, request: Request) -> HttpResponse:
        return HttpResponse(fleet_metrics(), content_type=CONTENT_TYPE_PLAIN_0_0_4)
