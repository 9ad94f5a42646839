"""Every route refuses anonymous requests, for every method, but a short list of public ones.

The routes are walked from Django's URL resolver and config/routing.py's websocket lists (see
routes.py), so a view added without authentication fails here without anyone listing it. Each
route is also checked to serve a signed-in superuser, so that its refusal is about credentials and
not a wrong path.
"""

from __future__ import annotations

import pytest
from accounts.models import User
from accounts.services import create_api_key, issue_api_token
from channels.db import database_sync_to_async
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.test import Client, override_settings
from gateway.proxy import MODEL_PREFIX, ROUTES

from config.asgi import application
from config.routing import agent_websocket_urlpatterns, browser_websocket_urlpatterns

from .routes import METHODS, Route, World, asks_for_credentials, http_routes, make_world, refused, walk

# Served without credentials, each for a reason; keyed by route (as ResolverMatch.route spells it).
PUBLIC = {
    # Load balancers and orchestrators probe it; it says only whether the database answers.
    "api/health/": "health check",
    # Signing in and out cannot need a signed-in user (both are rate-limited or harmless).
    "api/v1/auth/token/": "password -> token",
    "accounts/login/": "sign-in page",
    "accounts/logout/": "sign-out (POST; ends the session there is, if any)",
    "admin/login/": "the admin's sign-in page",
    "admin/logout/": "the admin's sign-out (anonymous: a redirect to the admin, which asks to sign in)",
    # Answers every unknown /api/ path with a JSON 404, and reads nothing.
    "^api/(?P<rest>.*)$": "JSON 404 for unknown API paths",
    # plotly.js of the public plotly package (cached immutably; see dashboard/assets.py).
    "assets/plotly-<str:version>.min.js": "a static asset",
}

ROUTES_TO_GUARD = [route for route in http_routes() if route.template not in PUBLIC]


@pytest.fixture
def world(db: None) -> World:
    return make_world()


def test_every_public_route_exists_and_the_walk_finds_the_known_ones() -> None:
    templates = {route.template for route in http_routes()}
    assert set(PUBLIC) <= templates, f"stale public entries: {set(PUBLIC) - templates}"
    for known in ("api/v1/models/(?P<pk>[0-9]+)/$", "jobs/<int:pk>/apply/", "playground/key/", "admin/"):
        assert known in templates


@pytest.mark.parametrize("route", ROUTES_TO_GUARD, ids=str)
def test_it_refuses_anonymous_requests_on_every_route(world: World, route: Route) -> None:
    path = world.path(route)
    # Without CSRF checks, so that a refusal comes from authentication and not a missing CSRF token.
    anonymous = Client(enforce_csrf_checks=False)
    api = route.template.startswith("api/")
    wrong: dict[str, int | str] = {}
    for method in METHODS:
        response = anonymous.generic(method, path)
        if not refused(response):
            wrong[method] = response.status_code
        elif api and (response.status_code, response.get("WWW-Authenticate")) != (401, "Token"):
            wrong[method] = f"{response.status_code}, not the API's 401 asking for a token"
    assert not wrong, f"{path} answers anonymous requests: {wrong}"

    # What the anonymous lacked is credentials: a superuser is not asked for them. (Some routes
    # refuse everyone, 403: the admin's add pages of issued secrets, its autocomplete without params.)
    signed_in = Client()
    signed_in.force_login(world.superuser)
    answer = signed_in.get(path)
    assert answer.status_code == 403 or not asks_for_credentials(answer), f"{path} wants a sign-in"


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_worker_thread_connections")
async def test_the_v1_gateway_refuses_requests_without_an_end_user_key() -> None:
    world = await database_sync_to_async(make_world)()
    # A user's operator token and a signed-in session are not end-user keys either.
    operator = await database_sync_to_async(_operator_token)(world.viewer)
    session = await database_sync_to_async(_session_of)(world.superuser)
    paths = [*ROUTES, "/v1/models", f"{MODEL_PREFIX}{world.model.name}"]
    credentials = [[], [(b"authorization", f"Bearer {operator}".encode())], [(b"cookie", session)]]
    served = []
    for path in paths:
        for method in METHODS:
            for extra in credentials:
                headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"), *extra]
                request = HttpCommunicator(application, method, path, body=b"{}", headers=headers)
                status = (await request.get_response(timeout=10))["status"]
                if status not in (401, 405):
                    served.append((method, path, status))
    assert not served, f"/v1 answers without an end-user key: {served}"
    # The key is what is missing: with one, /v1/models answers.
    key = await database_sync_to_async(lambda: create_api_key(world.viewer, "mine").plaintext)()
    headers = [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {key}".encode())]
    answer = HttpCommunicator(application, "GET", "/v1/models", headers=headers)
    assert (await answer.get_response(timeout=10))["status"] == 200


def _session_of(user: User) -> bytes:
    """The Cookie header of a browser signed in as ``user``."""
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def _operator_token(user: User) -> str:
    return issue_api_token(user, "script").plaintext


BROWSER_SOCKETS = list(walk(browser_websocket_urlpatterns))
AGENT_SOCKETS = list(walk(agent_websocket_urlpatterns))


def _socket(path: str, *headers: tuple[bytes, bytes]) -> WebsocketCommunicator:
    # An Origin the origin check allows, so that a refusal is about credentials.
    base = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
    return WebsocketCommunicator(application, path, headers=[*base, *headers])


async def _opens(comm: WebsocketCommunicator) -> bool:
    connected, _ = await comm.connect(timeout=10)
    await comm.disconnect()
    return connected


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_worker_thread_connections")
@pytest.mark.parametrize("route", BROWSER_SOCKETS, ids=str)
async def test_dashboard_sockets_refuse_anonymous_browsers(route: Route) -> None:
    world = await database_sync_to_async(make_world)()
    path = world.path(route)
    assert not await _opens(_socket(path)), f"{path} opens without a session"
    viewer = await database_sync_to_async(_session_of)(world.viewer)
    assert await _opens(_socket(path, (b"cookie", viewer))), f"{path} refuses a signed-in viewer"


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_worker_thread_connections")
@pytest.mark.parametrize("route", AGENT_SOCKETS, ids=str)
async def test_agent_sockets_refuse_anything_but_a_host_token(route: Route) -> None:
    world = await database_sync_to_async(make_world)()
    path = world.path(route)
    with override_settings(AGENTS_SWEEP_IN_ASGI=False, AGENTS_DESIRED_POLL_S=60.0):
        assert not await _opens(_socket(path)), f"{path} opens without a token"
        # A user's credentials are not a host's: an operator token, a superuser's session.
        operator = await database_sync_to_async(_operator_token)(world.superuser)
        assert not await _opens(_socket(path, (b"authorization", f"Bearer {operator}".encode())))
        session = await database_sync_to_async(_session_of)(world.superuser)
        assert not await _opens(_socket(path, (b"cookie", session)))
        agent = (b"authorization", f"Bearer {world.agent_token}".encode())
        assert await _opens(_socket(path, agent)), f"{path} refuses its host's token"
