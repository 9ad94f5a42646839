"""Every route the platform serves, with a concrete path: the rows of the authorization matrices.

Routes come from walking Django's URL resolver and the websocket URL lists of config/routing.py
(recursively over URLResolver/URLPattern), so a route added anywhere is checked without being named
in a test. Path parameters are filled from a `World` of one object of each kind, so that a request
reaches the view itself and not a 404 of a missing object.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from accounts.models import ApiKey, ApiToken, Role, User
from accounts.services import create_api_key, issue_api_token
from dashboard.assets import PLOTLY_VERSION
from deployments.models import Deployment
from django.apps import apps
from django.conf import settings
from django.contrib.contenttypes.models import ContentType
from django.http import HttpResponseBase
from django.shortcuts import resolve_url
from django.urls import URLPattern, URLResolver, resolve, reverse
from django.utils import timezone
from gateway.models import Usage
from inventory.models import Device, DeviceKind, Host
from inventory.services import issue_agent_token, register_host
from jobs.models import Job, JobStatus
from planning.models import ModelProfile, PlacementPlan
from registry.models import ServedModel

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
WRITES = ("POST", "PUT", "PATCH", "DELETE")

# A plan placing nothing, as serving.placement.Plan.to_dict() writes it.
EMPTY_PLAN = {
    "servers": [], "assignments": [], "pairings": [], "dram_fallbacks": [], "server_summaries": [],
    "objective": 0.0, "best_bound": 0.0, "status": "optimal", "solver": "greedy", "solve_seconds": 0.0,
    "unit_bytes": 1, "role_weight": 0.0,
}  # fmt: skip

# A path converter (<int:pk>, <id>) or a named regex group ((?P<pk>[0-9]+)); groups hold no parentheses.
_PARAMETER = re.compile(r"<(?:\w+:)?(\w+)>|\(\?P<(\w+)>[^()]*\)")


@dataclass(frozen=True)
class Route:
    """``template``: the route as Django joins it (``ResolverMatch.route``), e.g.
    ``api/v1/models/(?P<pk>[0-9]+)/$``."""

    template: str

    def __str__(self) -> str:
        return self.template


def walk(patterns: Iterable[URLPattern | URLResolver], prefix: str = "") -> Iterator[Route]:
    for pattern in patterns:
        # Django's URLResolver._join_route: a nested route's leading "^" is dropped.
        template = prefix + str(pattern.pattern).removeprefix("^") if prefix else str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from walk(pattern.url_patterns, template)
        else:
            yield Route(template)


def http_routes() -> list[Route]:
    from django.urls import get_resolver

    return list(walk(get_resolver().url_patterns))


@dataclass
class World:
    """One object of each kind the routes take in their paths, and their users."""

    admin: User  # role admin, not staff
    viewer: User
    other_viewer: User  # owns what `viewer` must not see
    superuser: User
    model: ServedModel
    host: Host
    device: Device
    deployment: Deployment
    job: Job  # a succeeded place job whose plan is already applied: applying it changes nothing
    viewer_key: ApiKey
    other_key: ApiKey
    other_token: ApiToken
    agent_token: str  # the host's, in plaintext
    agent_token_prefix: str

    def path(self, route: Route) -> str:
        """The route's path with each parameter filled; checked to resolve to this very route."""
        out: list[str] = []
        end = 0
        for match in _PARAMETER.finditer(route.template):
            out.append(route.template[end : match.start()])
            out.append(self._value(match.group(1) or match.group(2), "".join(out)))
            end = match.end()
        out.append(route.template[end:])
        path = "/" + "".join(out).removeprefix("^").removesuffix("$")
        if not path.startswith("/ws/"):
            resolved = resolve(path).route
            assert resolved == route.template, f"{path} resolves to {resolved}, not {route}"
        return path

    def _value(self, name: str, before: str) -> str:
        segments = [s for s in before.split("/") if s]
        by_collection = {
            "api-keys": self.viewer_key.pk,
            "models": self.model.pk,
            "hosts": self.host.pk,
            "devices": self.device.pk,
            "deployments": self.deployment.pk,
            "jobs": self.job.pk,
            "plans": self.job.pk,
            "profiles": self.model.name,
            "latency": self.model.name,
        }
        if name == "version":
            return PLOTLY_VERSION
        if name in ("rest", "url"):  # catch-all routes: a path nothing else serves
            return "no-such-page/"
        if name == "app_label":
            return "registry"
        if name == "content_type_id":
            return str(ContentType.objects.get_for_model(ServedModel).pk)
        if segments[0] == "admin" and name in ("object_id", "id"):
            if segments[1] == "r":  # the admin's "view on site" shortcut: content type, then object
                return str(self.model.pk)
            row = apps.get_model(segments[1], segments[2]).objects.order_by("pk").first()
            return str(row.pk if row is not None else 1)
        return str(by_collection[segments[-1]])


def make_world() -> World:
    def user(name: str, role: Role, superuser: bool = False) -> User:
        # No password (the tests sign in with force_login): hashing one costs a tenth of a second.
        return User.objects.create_user(
            username=name, password=None, role=role, is_superuser=superuser, is_staff=superuser
        )

    admin, viewer, other = user("alice", Role.ADMIN), user("bob", Role.VIEWER), user("charlie", Role.VIEWER)
    superuser = user("root", Role.VIEWER, superuser=True)
    model = ServedModel.objects.create(
        name="tiny", source="/models/tiny", max_context_length=256, slo_ttft_p99_ms=500.0, slo_tbt_p99_ms=50.0
    )
    host = register_host("sim-a", "127.0.0.1")
    device = Device.objects.create(
        host=host, index=0, uuid="GPU-sim-a-0", name="H100", kind=DeviceKind.GPU, memory_total_bytes=1 << 36
    )
    deployment = Deployment.objects.create(model=model, host=host)
    deployment.devices.set([device])
    job = Job.objects.create(kind="place", status=JobStatus.SUCCEEDED, created_by=admin)
    PlacementPlan.objects.create(
        job=job, plan=EMPTY_PLAN, moves=[], fingerprint="x", applied_at=timezone.now(), applied_by=admin
    )
    ModelProfile.objects.create(
        model=model, backend="simulator", role="producer", max_rps=1.0, kv_capacity_bytes=1,
        free_kv_bytes=1, lendable_bytes=1, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50, data={},
    )  # fmt: skip
    viewer_key = create_api_key(viewer, "bob-key").record
    other_key = create_api_key(other, "charlies-private-key").record
    day = datetime(2025, 1, 1, tzinfo=UTC)
    for key in (viewer_key, other_key):
        Usage.objects.create(key=key, model=model, model_name=model.name, period_start=day, requests=1)
    agent = issue_agent_token(host)
    return World(
        admin=admin,
        viewer=viewer,
        other_viewer=other,
        superuser=superuser,
        model=model,
        host=host,
        device=device,
        deployment=deployment,
        job=job,
        viewer_key=viewer_key,
        other_key=other_key,
        other_token=issue_api_token(other, "charlies-script").record,
        agent_token=agent.plaintext,
        agent_token_prefix=agent.record.prefix,
    )


def asks_for_credentials(response: HttpResponseBase) -> bool:
    """401/403, or a redirect to a sign-in page (the site's or the admin's)."""
    if response.status_code in (401, 403):
        return True
    sign_in = (resolve_url(settings.LOGIN_URL), reverse("admin:login"))
    location = response.get("Location", "")
    return response.status_code in (301, 302) and location.split("?")[0] in sign_in


def refused(response: HttpResponseBase) -> bool:
    """Nothing was done: credentials asked for, or the method is not served there (405)."""
    return asks_for_credentials(response) or response.status_code == 405
