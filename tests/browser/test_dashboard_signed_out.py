"""A dashboard page whose socket lost access goes to the sign-in page, and comes back after it.

The server closes a socket with 4401 once its session or user lost access (consumers.py), and
refuses the handshake (HTTP 403) of one without; live.js used to reconnect to either every 10 s
forever. A socket dropped or refused while the user is still signed in is retried as before.

A 4401 also closes the socket of a browser that is still signed in under a new session key (Django
rotates the key when the user changes their own password); such a page reconnects instead, and a
server that keeps closing its new sockets with 4401 is retried with back-off.

A page whose subject was deleted (a model, a deployment) answers 404, and the handshake of its
socket is refused; live.js used to retry it every 10 s forever. It now says so and stops. An open
socket whose subject is deleted is closed by the server with 4404: live.js used to reconnect (to be
refused) before saying so; it now says so at once and opens no other socket.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from accounts.models import User
from django.contrib.sessions.models import Session
from inventory.models import Host
from registry.models import ServedModel

from tests.browser.conftest import PASSWORD, db_call, sign_in
from tests.fleet.servers import AsgiServer

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SIGN_IN_AGAIN = "/accounts/login/?next=%2Fjobs%2F"
NEW_PASSWORD = "rotated-pw-5Tz8"
# Records the page's sockets (real ones) so that the test can drop the open one, with the frames
# each received and the codes they were closed with.
RECORD_SOCKETS = """
window.__sockets = [];
window.__closes = [];
window.WebSocket = class extends window.WebSocket {
  constructor(url) {
    super(url);
    window.__sockets.push(this);
    this.__frames = 0;
    this.addEventListener("message", () => this.__frames++);
    this.addEventListener("close", (event) => window.__closes.push(event.code));
  }
};
"""
# RECORD_SOCKETS, and the waits live.js schedules its reconnects with.
RECORD_RECONNECTS = (
    RECORD_SOCKETS
    + """
window.__waits = [];
const schedule = window.setTimeout;
window.setTimeout = function (fn, ms, ...args) {
  if (fn.name === "connect") window.__waits.push(ms);
  return schedule(fn, ms, ...args);
};
"""
)
# Sockets that open and are closed with 4401 at once, as by a server that keeps refusing the session
# while the page itself still loads; and the waits live.js schedules its reconnects with.
REVOKED_SOCKETS = """
window.__sockets = [];
window.__waits = [];
const schedule = window.setTimeout;
window.setTimeout = function (fn, ms, ...args) {
  if (fn.name === "connect") window.__waits.push(ms);
  return schedule(fn, ms, ...args);
};
window.WebSocket = class {
  constructor(url) {
    window.__sockets.push(this);
    schedule(() => { this.onopen(); this.onclose({ code: 4401 }); }, 0);
  }
  close() {}
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


def test_a_password_change_in_the_same_browser_keeps_the_overview_live_and_on_its_page(
    users: dict[str, User], quick_recheck: AsgiServer, browser: Any
) -> None:
    # Django's password change keeps the browser signed in under a new session key
    # (update_session_auth_hash); the overview's socket, holding the old key, is closed with 4401.
    db_call(lambda: User.objects.filter(username="ada").update(is_staff=True))  # may use /admin/
    page = sign_in(browser, quick_recheck.url, "ada")
    page.context.add_init_script(RECORD_SOCKETS)
    page.goto("/")
    page.wait_for_selector("#live-status[data-state=live]")
    visited: list[str] = []
    page.on("framenavigated", lambda frame: visited.append(frame.url) if frame == page.main_frame else None)

    admin = page.context.new_page()
    admin.goto("/admin/password_change/")
    admin.fill("input[name=old_password]", PASSWORD)
    admin.fill("input[name=new_password1]", NEW_PASSWORD)
    admin.fill("input[name=new_password2]", NEW_PASSWORD)
    admin.click("input[type=submit]")
    admin.wait_for_url(quick_recheck.url + "/admin/password_change/done/")

    # The old socket is closed with 4401; a new one is let in with the new cookie and gets its snapshot.
    page.wait_for_function(
        "() => window.__sockets.length === 2 && window.__sockets[1].__frames > 0", timeout=15_000
    )
    db_call(lambda: Host.objects.create(name="after-the-password-change"))
    page.wait_for_selector('section.host[data-host="after-the-password-change"]')
    assert page.evaluate("() => [window.__sockets.length, window.__closes]") == [2, [4401]]
    assert page.url == quick_recheck.url + "/"
    assert visited == []  # never sent to the sign-in page
    assert page.get_attribute("#live-status", "data-state") == "live"


def test_a_server_that_keeps_closing_new_sockets_with_4401_is_retried_with_back_off(
    users: dict[str, User], slow_recheck: AsgiServer, browser: Any
) -> None:
    page = sign_in(browser, slow_recheck.url, "vic")
    page.context.add_init_script(REVOKED_SOCKETS)
    page.goto("/")
    # The first 4401 is answered by an immediate reconnect (the page still loads); the next ones,
    # closed at once again, wait as other reconnects do: 0.5 s, doubled each time.
    page.wait_for_function("() => window.__sockets.length >= 5", timeout=15_000)
    assert page.evaluate("() => window.__waits.slice(0, 3)") == [500, 1000, 2000]
    assert page.url == slow_recheck.url + "/"


def _doomed_model() -> ServedModel:
    """A model whose page the test opens, then deletes."""
    return ServedModel.objects.create(
        name="doomed", source="/m/doomed", max_context_length=256, slo_ttft_p99_ms=500, slo_tbt_p99_ms=50
    )


def test_a_page_whose_model_was_deleted_stops_reconnecting_and_says_so(
    users: dict[str, User], slow_recheck: AsgiServer, browser: Any
) -> None:
    model = db_call(_doomed_model)
    page = sign_in(browser, slow_recheck.url, "vic")
    page.context.add_init_script(RECORD_SOCKETS)
    page.goto(f"/models/{model.pk}/")
    page.wait_for_selector("#live-status[data-state=live]")
    db_call(lambda: ServedModel.objects.filter(pk=model.pk).delete())  # the open socket stays open
    page.evaluate("() => window.__sockets.at(-1).close()")  # a drop: the reconnect is refused

    status = page.locator("#live-status")
    page.wait_for_function(
        "() => document.getElementById('live-status').textContent.includes('no longer exists')",
        timeout=15_000,
    )
    assert status.get_attribute("data-state") == "down"
    assert status.text_content() == "this no longer exists; nothing more will arrive"
    assert page.evaluate("() => window.__sockets.length") == 2  # the open one and the refused reconnect
    page.wait_for_timeout(3_000)  # longer than the back-off live.js would wait before a retry
    assert page.evaluate("() => window.__sockets.length") == 2
    assert page.url == slow_recheck.url + f"/models/{model.pk}/"


def test_a_socket_closed_because_its_model_was_deleted_is_not_reopened(
    users: dict[str, User], slow_recheck: AsgiServer, browser: Any
) -> None:
    model = db_call(_doomed_model)
    page = sign_in(browser, slow_recheck.url, "vic")
    page.context.add_init_script(RECORD_RECONNECTS)
    page.goto(f"/models/{model.pk}/")
    page.wait_for_selector("#live-status[data-state=live]")
    db_call(lambda: ServedModel.objects.filter(pk=model.pk).delete())  # the server's next tick: 4404

    page.wait_for_function("() => window.__closes.length > 0", timeout=15_000)
    assert page.evaluate("() => window.__closes") == [4404]
    status = page.locator("#live-status")
    assert status.text_content() == "this no longer exists; nothing more will arrive"
    assert status.get_attribute("data-state") == "down"
    # Set in the close handler, as a reconnect would have been scheduled there: nothing was.
    assert page.evaluate("() => [window.__sockets.length, window.__waits]") == [1, []]
