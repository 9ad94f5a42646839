"""The dashboard's scripts against crafted socket frames: hostile strings stay text, new rows land in
order (never on a page of older jobs), and a reconnect's snapshot replaces what the page showed.

A stand-in ``WebSocket`` (installed before the page's scripts run) lets the test deliver frames and
drop the connection; the pages themselves come from the real server.
"""

from __future__ import annotations

from typing import Any

import pytest
from accounts.models import User
from dashboard.snapshots import JOBS_SHOWN
from jobs.models import Job, JobStatus

from tests.browser.conftest import db_call, sign_in
from tests.fleet.servers import AsgiServer

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

HOSTILE = '<img src=x onerror="window.__xss = 1">'
FAKE_SOCKET = """
window.__sockets = [];
window.WebSocket = class {
  constructor(url) { this.url = url; window.__sockets.push(this); setTimeout(() => this.onopen(), 0); }
  send() {}
  close() { this.onclose({}); }
};
window.__push = (frame) => window.__sockets.at(-1).onmessage({ data: JSON.stringify(frame) });
"""


def open_page(browser: Any, server: AsgiServer, path: str) -> Any:
    page = sign_in(browser, server.url, "ada")
    page.context.add_init_script(FAKE_SOCKET)
    page.goto(path)
    page.wait_for_selector("#live-status[data-state=live]")
    return page


def reconnect(page: Any) -> None:
    """Drop the socket; wait until live.js has opened a new one."""
    page.evaluate("() => window.__sockets.at(-1).close()")
    page.wait_for_function("() => window.__sockets.length === 2")
    page.wait_for_selector("#live-status[data-state=live]")


def job(status: str = "running") -> dict[str, Any]:
    return {
        "kind": "noop" + HOSTILE,
        "status": status,
        "progress": 0.5,
        "error": "boom" + HOSTILE,
        "created": "2026-01-01T00:00:09.123456+00:00",
        "finished": None,
    }


def rows(page: Any) -> list[str]:
    return list(page.eval_on_selector_all("#jobs tbody tr", "rs => rs.map(r => r.dataset.job)"))


def assert_inert(page: Any) -> None:
    assert page.evaluate("() => [window.__xss, document.querySelectorAll('main img').length]") == [None, 0]


def test_new_jobs_are_listed_newest_first_and_a_reconnect_drops_jobs_no_longer_streamed(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    page = open_page(browser, server, "/jobs/")
    page.evaluate("(frame) => window.__push(frame)", {"type": "snapshot", "data": {"job:1": job()}})
    # The server lists a delta's keys newest first; both must land above job 1, in order.
    delta = {"type": "delta", "set": {"job:3": job(), "job:2": job()}, "remove": []}
    page.evaluate("(frame) => window.__push(frame)", delta)
    assert rows(page) == ["3", "2", "1"]
    first = page.locator('tr[data-job="1"]')
    assert first.locator("td").nth(1).inner_text() == "noop" + HOSTILE
    assert first.locator(".status").inner_text() == "running: boom" + HOSTILE
    # Its time as the page writes the rows it was loaded with (the utc_time filter), not raw ISO.
    created = first.locator("td time")
    assert created.inner_text() == "2026-01-01 00:00:09 UTC"
    assert created.get_attribute("datetime") == "2026-01-01T00:00:09.123456+00:00"

    reconnect(page)
    # Jobs 4 and 5 were created while the socket was down; 1 and 2 left the newest listed.
    snapshot = {"job:5": job(), "job:4": job(), "job:3": job("succeeded")}
    page.evaluate("(frame) => window.__push({type: 'snapshot', data: frame})", snapshot)
    assert rows(page) == ["5", "4", "3"]
    assert page.locator('tr[data-job="3"]').get_attribute("data-status") == "succeeded"
    assert_inert(page)


def test_the_jobs_list_says_when_it_has_no_job_and_stops_saying_it_when_one_arrives(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    page = open_page(browser, server, "/jobs/")
    empty = page.locator("#jobs tr.no-jobs")
    assert empty.inner_text() == "No jobs yet."
    page.evaluate("(frame) => window.__push(frame)", {"type": "delta", "set": {"job:1": job()}, "remove": []})
    assert rows(page) == ["1"] and empty.count() == 0
    page.evaluate("(frame) => window.__push(frame)", {"type": "snapshot", "data": {}})  # deleted since
    assert rows(page) == [None] and empty.inner_text() == "No jobs yet."


def test_the_gpu_map_draws_an_unknown_host_from_a_delta_and_resyncs_on_reconnect(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    page = open_page(browser, server, "/")
    page.evaluate("() => window.__push({type: 'snapshot', data: {}})")
    card = {
        "host": 7, "index": 0, "name": "H100" + HOSTILE, "kind": "gpu", "total": 80, "role": "none",
        "used": 0, "lent": 0, "borrowed": 0, "free": 80, "paired_with": None, "utilization": None, "ts": None,
        "deployments": [
            {"id": 3, "model_id": 5, "model": "m" + HOSTILE, "desired": "running", "observed": "running"},
        ],
    }  # fmt: skip
    bare = {**card, "index": 1, "deployments": []}
    host = {"name": "h" + HOSTILE, "status": "online", "simulated": False, "last_seen": None}
    delta = {"type": "delta", "set": {"host:7": host, "device:70": card, "device:71": bare}, "remove": []}
    page.evaluate("(frame) => window.__push(frame)", delta)
    section = page.locator("section.host")
    assert section.locator("h2").inner_text().startswith("h" + HOSTILE)
    assert section.locator(".card h3").all_inner_texts() == [
        "GPU 0 · H100" + HOSTILE,
        "GPU 1 · H100" + HOSTILE,
    ]
    assert section.locator(".card .ts").first.inner_text() == "no sample yet"
    # What runs on each device, linked to its model's page; a device without one says so.
    placed = section.locator(".card .placed li")
    assert placed.all_inner_texts() == ["m" + HOSTILE + " #3 running", "no deployment"]
    assert placed.first.locator("a").get_attribute("href") == "/models/5/"
    assert_inert(page)

    reconnect(page)
    page.evaluate("() => window.__push({type: 'snapshot', data: {}})")
    assert page.locator("section.host").count() == 0  # the host went away while the socket was down
    assert page.locator("#hosts .empty").inner_text() == "No hosts yet."


def test_a_page_of_older_jobs_only_updates_its_rows_and_page_one_offers_older_once_jobs_fall_off(
    users: dict[str, User], server: AsgiServer, browser: Any
) -> None:
    def make(count: int) -> list[int]:
        Job.objects.bulk_create([Job(kind="noop", status=JobStatus.RUNNING) for _ in range(count)])
        return list(Job.objects.order_by("pk").values_list("pk", flat=True))

    pks = db_call(make, JOBS_SHOWN)  # every job fits on page 1: no pager
    page = open_page(browser, server, "/jobs/")
    assert page.locator("#jobs-pager").is_hidden()
    newer = {f"job:{pk}": job() for pk in [pks[-1] + 1, *pks[:0:-1]]}  # a new job; pks[0] falls off
    page.evaluate("(data) => window.__push({type: 'snapshot', data: data})", newer)
    assert rows(page)[-1] == str(pks[1]) and page.locator("#older-jobs").is_visible()

    pks = db_call(make, 1)
    older = open_page(browser, server, "/jobs/?page=2")
    socket = older.evaluate("() => window.__sockets.at(-1).url")
    assert socket.endswith(f"/ws/dashboard/jobs/?through={pks[0]}")
    delta = {"type": "delta", "set": {f"job:{pks[0]}": job("failed"), "job:999999": job()}, "remove": []}
    older.evaluate("(frame) => window.__push(frame)", delta)
    assert rows(older) == [str(pks[0])]  # the new job is not listed here
    assert older.locator(f'tr[data-job="{pks[0]}"]').get_attribute("data-status") == "failed"
    older.evaluate("() => window.__push({type: 'snapshot', data: {}})")  # deleted: the row stays as it was
    assert rows(older) == [str(pks[0])] and older.locator("#newer-jobs").get_attribute("href") == "/jobs/"
    assert_inert(older)
