"""Viewers read and admins write, on every route: the REST API, the dashboard, the playground.

A viewer is refused every write (POST, PUT, PATCH, DELETE) but on what a user owns (their API keys,
their playground key, their password); wherever a viewer is refused, an admin is not. Routes come
from Django's URL resolver (routes.py), so a write view added without a role check fails here.
"""

from __future__ import annotations

import pytest
from accounts.models import User
from accounts.services import issue_api_token
from django.test import Client
from rest_framework.test import APIClient

from .routes import WRITES, Route, World, http_routes, make_world

# Writes a viewer may make, because what they change is their own.
OWN = {
    ("api/v1/api-keys/$", "POST"): "a new API key of their own (quotas: admins only)",
    ("api/v1/api-keys/(?P<pk>[0-9]+)/$", "PATCH"): "renaming their own key (others' keys: 404)",
    ("api/v1/api-keys/(?P<pk>[0-9]+)/revoke/$", "POST"): "revoking their own key (others' keys: 404)",
    ("api-keys/new/", "POST"): "the dashboard's form for a new key of their own (quotas: admins only)",
    ("api-keys/<int:pk>/revoke/", "POST"): "the dashboard's revoke of their own key (others' keys: 404)",
    ("playground/key/", "POST"): "the playground's key, issued to themselves",
    ("accounts/password_change/", "POST"): "their own password",
    ("accounts/password_change/", "PUT"): "the same (Django's form views take PUT as POST)",
}
# Routes outside this matrix: public ones (test_every_route_needs_auth.py), and the Django admin,
# where Django's staff flag and model permissions decide (a viewer, not staff, is sent to its login).
OUTSIDE = (
    "api/health/",
    "api/v1/auth/token/",
    "^api/(?P<rest>.*)$",
    "accounts/login/",
    "accounts/logout/",
    "assets/plotly-<str:version>.min.js",
)
ROUTES = [r for r in http_routes() if r.template not in OUTSIDE and not r.template.startswith("admin/")]


@pytest.fixture
def world(db: None) -> World:
    return make_world()


def _client(user: User, route: Route) -> Client:
    """The API with an operator token (as scripts use it), pages with a session."""
    if route.template.startswith("api/"):
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Token {issue_api_token(user, 'test').plaintext}")
        return api
    client = Client(enforce_csrf_checks=False)
    client.force_login(user)
    return client


def test_the_exceptions_name_existing_routes() -> None:
    templates = {r.template for r in http_routes()}
    assert {template for template, _ in OWN} <= templates
    assert set(OUTSIDE) <= templates


@pytest.mark.parametrize("route", ROUTES, ids=str)
def test_viewers_are_refused_every_write_that_admins_may_make(world: World, route: Route) -> None:
    path = world.path(route)
    viewer, admin = _client(world.viewer, route), _client(world.admin, route)
    wrong = []
    for method in WRITES:
        status = viewer.generic(method, path, "{}", content_type="application/json").status_code
        if (route.template, method) in OWN:
            if status in (401, 403):
                wrong.append(f"viewer {method}: {status}, though it is their own")
            continue
        if status not in (403, 405):
            wrong.append(f"viewer {method}: {status}")
        if status == 403:  # refused for the role, so an admin may
            status = admin.generic(method, path, "{}", content_type="application/json").status_code
            if status in (401, 403):
                wrong.append(f"admin {method}: {status}")
    assert not wrong, f"{path}: {wrong}"


def test_viewers_do_not_see_or_touch_other_users_keys_tokens_or_usage(world: World) -> None:
    """No route a viewer reads names another user's API key or operator token, or a host's agent
    token; another user's key's detail, rename and revoke are 404s. (Figures per model, like gateway
    latency, are for everyone: they name no key or user.)"""
    secrets = (
        world.other_key.name,
        world.other_key.prefix,
        world.other_token.name,
        world.other_token.prefix,
        world.agent_token_prefix,
    )
    leaks = []
    for route in ROUTES:
        path = world.path(route)
        body = _client(world.viewer, route).get(path).content.decode(errors="replace")
        leaks += [(path, s) for s in secrets if s in body]
    assert not leaks, f"a viewer sees another user's credentials: {leaks}"

    viewer = _client(world.viewer, Route("api/"))
    other = f"/api/v1/api-keys/{world.other_key.pk}/"
    assert viewer.get(other).status_code == 404
    assert viewer.patch(other, {"name": "mine"}, format="json").status_code == 404
    assert viewer.post(f"{other}revoke/").status_code == 404
    world.other_key.refresh_from_db()
    assert (world.other_key.name, world.other_key.revoked) == ("charlies-private-key", False)

    # An admin sees everyone's keys and usage.
    admin = _client(world.admin, Route("api/"))
    assert len(admin.get("/api/v1/api-keys/").json()["results"]) == 2
    assert len(admin.get("/api/v1/gateway/usage/").json()["results"]) == 2
    assert len(viewer.get("/api/v1/gateway/usage/").json()["results"]) == 1
