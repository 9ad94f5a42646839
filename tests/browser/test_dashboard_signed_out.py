"""A dashboard page whose socket lost access goes to the sign-in page, and comes back after it.

The server closes a socket with 4401 once its session or user lost access (consumers.py), and
refuses the handshake (HTTP 403) of one without; live.js used to reconnect to either every 10 s
forever. A socket dropped or refused while the user is still signed in is retried as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from accounts.models import User
from django.contrib.sessions.models import Session

from tests.browser.conftest import PASSWORD, db_call, sign_in
from tests.fleet.servers import AsgiServer

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SIGN_IN_AGAIN = "/accounts/login/?next=%2Fjobs%2F"
# Records the page's sockets (real ones) so that the test can drop the open one.
RECORD_SOCKETS = """
window.__sockets = [];
window.WebSocket = class extends window.WebSocket {
  constructor(url) { super(url); window.__sockets.push(this); }
};
"""
# Sockets whose handshake always fails, as a refused one or a server that is down: closed (1006)
# without ever opening.
REFUSED_SOCKETS = """
window.__sockets = [];
window.WebSocket = class {
  constructor(url) { window.__sockets.push(this); setTimeout(() => this.onclose({ code: 1006 }), 0); }
  close() {}
};
"""


def start_server(recheck_s: str) -> Iterator[AsgiServer]:
    server = AsgiServer(DASHBOARD_AUTH_RECHECK_S=recheck_s)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def quick_recheck(transactional_db: None) -> Iterator[AsgiServer]:
    yield from start_server("0.2")


@pytest.fixture
def slow_recheck(transactional_db: None) -> Iterator[AsgiServer]:
    """A server whose open sockets are not re-checked during the test: only a handshake is."""
    yield from start_server("600")


def live_jobs_page(browser: Any, server: AsgiServer, init_script: str = "") -> tuple[Any, list[str]]:
    """The jobs page signed in as vic; and the jobs sockets it opens."""
    page = sign_in(browser, server.url, "vic")
    if init_script:
        page.context.add_init_script(init_script)
    sockets: list[str] = []
    page.on(
        "websocket", lambda ws: sockets.append(ws.url) if ws.url.endswith("/ws/dashboard/jobs/") else None
    )
    page.goto("/jobs/")
    return page, sockets


def test_a_socket_closed_for_a_deactivated_user_sends_the_page_to_sign_in_and_back(
    users: dict[str, User], quick_recheck: AsgiServer, browser: Any
) -> None:
    page, sockets = live_jobs_page(browser, quick_recheck)
    page.wait_for_selector("#live-status[data-state=live]")
    db_call(lambda: User.objects.filter(username="vic").update(is_active=False))

    page.wait_for_url(quick_recheck.url + SIGN_IN_AGAIN, timeout=15_000)
    assert len(sockets) == 1  # the closed socket was not retried

    db_call(lambda: User.objects.filter(username="vic").update(is_active=True))
    page.fill("input[name=username]", "vic")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(quick_recheck.url + "/jobs/")
    page.wait_for_selector("#live-status[data-state=live]")


def test_a_refused_reconnect_after_signing_out_sends_the_page_to_sign_in(
    users: dict[str, User], slow_recheck: AsgiServer, browser: Any
) -> None:
    page, sockets = live_jobs_page(browser, slow_recheck, RECORD_SOCKETS)
    page.wait_for_selector("#live-status[data-state=live]")
    db_call(lambda: Session.objects.all().delete())  # signed out everywhere (the socket stays open)
    page.evaluate("() => window.__sockets.at(-1).close()")  # a drop: live.js reconnects, refused

    page.wait_for_url(slow_recheck.url + SIGN_IN_AGAIN, timeout=15_000)
    assert len(sockets) == 2  # the open one and the refused reconnect; no retry after that


def test_refused_handshakes_are_retried_while_signed_in_and_not_once_signed_out(
    users: dict[str, User], slow_recheck: AsgiServer, browser: Any
) -> None:
    page, _ = live_jobs_page(browser, slow_recheck, REFUSED_SOCKETS)
    page.wait_for_function("() => window.__sockets.length >= 3")  # the page itself still loads
    assert page.url == slow_recheck.url + "/jobs/"
    assert page.get_attribute("#live-status", "data-state") == "down"

    db_call(lambda: Session.objects.all().delete())
    page.wait_for_url(slow_recheck.url + SIGN_IN_AGAIN, timeout=15_000)
