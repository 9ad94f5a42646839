"""The jobs page's history: ``?page=N`` lists older jobs, with Older/Newer links; bad pages are refused
on the page (400, 404), never a 500; a page of older jobs streams its own rows, never new jobs."""

from __future__ import annotations

import re

import pytest
from accounts.models import User
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from dashboard import snapshots
from dashboard.consumers import stream_group
from dashboard.routing import websocket_urlpatterns
from django.test import Client
from jobs.models import Job, JobStatus

SHOWN = snapshots.JOBS_SHOWN


def make_jobs(count: int) -> list[int]:
    """``count`` noop jobs; their pks, oldest first."""
    Job.objects.bulk_create([Job(kind="noop", status=JobStatus.SUCCEEDED) for _ in range(count)])
    return list(Job.objects.order_by("pk").values_list("pk", flat=True))


def listed(page: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'<tr data-job="(\d+)"', page)]


def link(page: str, name: str) -> str | None:
    """The href of the pager link with id ``name``, if it is shown."""
    match = re.search(rf'<a href="([^"]+)" rel="\w+" id="{name}"( hidden)?>', page)
    return match[1] if match and not match[2] else None


def socket_path(page: str) -> str:
    return re.search(r'data-socket="([^"]+)"', page)[1]  # type: ignore[index]


@pytest.mark.django_db
def test_it_lists_older_jobs_page_by_page_with_older_and_newer_links(viewer_client: Client) -> None:
    pks = make_jobs(2 * SHOWN + 3)
    newest_first = pks[::-1]

    first = viewer_client.get("/jobs/").content.decode()
    assert listed(first) == newest_first[:SHOWN]  # the newest, as before paging
    assert socket_path(first) == "/ws/dashboard/jobs/" and 'data-page="/jobs/"' in first
    assert link(first, "newer-jobs") is None
    assert link(first, "older-jobs") == "/jobs/?page=2"
    assert "data-older" not in first and "Page 1 of 3" in first

    second = viewer_client.get("/jobs/?page=2")
    assert second.status_code == 200
    text = second.content.decode()
    assert listed(text) == newest_first[SHOWN : 2 * SHOWN]
    assert link(text, "newer-jobs") == "/jobs/"
    assert link(text, "older-jobs") == "/jobs/?page=3"
    assert "data-older" in text and "Page 2 of 3" in text and 'data-page="/jobs/?page=2"' in text
    assert socket_path(text) == f"/ws/dashboard/jobs/?through={newest_first[SHOWN]}"

    last = viewer_client.get("/jobs/?page=3").content.decode()
    assert listed(last) == newest_first[2 * SHOWN :] == pks[2::-1]
    assert link(last, "newer-jobs") == "/jobs/?page=2"
    assert link(last, "older-jobs") is None
    assert viewer_client.get("/jobs/?page=1").content.decode().count("<tr data-job=") == SHOWN


@pytest.mark.django_db
def test_the_first_page_hides_its_pager_while_every_job_fits(viewer_client: Client) -> None:
    make_jobs(SHOWN)
    page = viewer_client.get("/jobs/").content.decode()
    assert len(listed(page)) == SHOWN
    assert '<nav class="pager" id="jobs-pager" aria-label="Job history" hidden>' in page
    assert link(page, "older-jobs") is None and "Page 1 of" not in page


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("value", "status", "message"),
    [
        ("abc", 400, "Not a page number: &#x27;abc&#x27;."),
        ("", 400, "Not a page number: &#x27;&#x27;."),
        ("1.5", 400, "Not a page number"),
        ("-1", 400, "Not a page number"),
        ("²", 400, "Not a page number"),
        ("\u0661", 400, "Not a page number"),  # an Arabic-Indic 1: int() would read it
        ("0", 400, "No page 0: pages of jobs are numbered from 1."),
        ("000", 400, "No page 0: pages of jobs are numbered from 1."),
        ("4", 404, "No page 4: the jobs fill 2 pages."),
        ("9" * 5000, 404, "No page &#x27;999"),  # past int()'s 4300 digits
    ],
)
def test_it_refuses_a_bad_page_on_the_page_without_a_list(
    viewer_client: Client, value: str, status: int, message: str
) -> None:
    make_jobs(SHOWN + 1)
    response = viewer_client.get("/jobs/", {"page": value})
    assert response.status_code == status
    page = response.content.decode()
    assert 'id="refusal"' in page and message in page
    assert 'id="jobs"' not in page and "data-socket" not in page and "jobs.js" not in page
    assert '<a href="/jobs/" id="newest-jobs">' in page
    if status == 404:  # the page count was read: its last page is offered too
        assert '<a href="/jobs/?page=2" id="oldest-jobs">' in page


@pytest.mark.django_db
def test_with_no_job_only_the_first_page_exists(viewer_client: Client) -> None:
    assert "No jobs yet." in viewer_client.get("/jobs/").content.decode()
    response = viewer_client.get("/jobs/?page=2")
    assert response.status_code == 404
    assert "No page 2: the jobs fill 1 page." in response.content.decode()
    assert 'id="oldest-jobs"' not in response.content.decode()


@pytest.mark.django_db
def test_a_refused_job_form_shows_the_first_page_and_its_pager(admin_client: Client) -> None:
    pks = make_jobs(SHOWN + 1)
    page = admin_client.post("/jobs/start/", {"kind": "bogus", "params": "{}"}).content.decode()
    assert listed(page) == pks[::-1][:SHOWN]
    assert link(page, "older-jobs") == "/jobs/?page=2"


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_worker_thread_connections")
async def test_a_page_of_older_jobs_streams_its_rows_and_never_a_new_job(
    viewer_user: User, viewer_client: Client
) -> None:
    def setup() -> tuple[list[int], str, str]:
        pks = make_jobs(SHOWN + 2)
        Job.objects.filter(pk=pks[0]).update(status=JobStatus.RUNNING, progress=0.25)
        pages = [viewer_client.get(url).content.decode() for url in ("/jobs/?page=2", "/jobs/")]
        return pks, pages[0], pages[1]

    pks, older_page, first_page = await database_sync_to_async(setup)()
    older = await _connect(viewer_user, socket_path(older_page))
    newest = await _connect(viewer_user, socket_path(first_page))
    snapshot = await older.receive_json_from(timeout=5)
    assert sorted(int(key.split(":")[1]) for key in snapshot["data"]) == pks[:2] == sorted(listed(older_page))
    assert snapshot["data"][f"job:{pks[0]}"]["status"] == "running"
    first = await newest.receive_json_from(timeout=5)
    assert len(first["data"]) == SHOWN and f"job:{pks[0]}" not in first["data"]

    def change() -> int:
        Job.objects.filter(pk=pks[0]).update(status=JobStatus.SUCCEEDED, progress=1.0)
        return Job.objects.create(kind="noop", status=JobStatus.QUEUED).pk

    created = await database_sync_to_async(change)()
    await get_channel_layer().group_send(stream_group("jobs"), {"type": "dashboard.changed"})
    delta = await older.receive_json_from(timeout=5)
    assert delta == {"type": "delta", "set": {f"job:{pks[0]}": delta["set"][f"job:{pks[0]}"]}, "remove": []}
    assert delta["set"][f"job:{pks[0]}"]["status"] == "succeeded"
    live = await newest.receive_json_from(timeout=5)  # the first page: the new job, one falls off
    assert list(live["set"]) == [f"job:{created}"] and live["remove"] == [f"job:{pks[2]}"]
    assert await older.receive_nothing(timeout=1.5)
    await older.disconnect()
    await newest.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_worker_thread_connections")
@pytest.mark.parametrize("query", ["through=abc", "through=", "through=1&through=2", "through=²"])
async def test_the_jobs_socket_refuses_a_through_that_is_not_a_job_id(viewer_user: User, query: str) -> None:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/dashboard/jobs/?{query}")
    communicator.scope["user"] = viewer_user
    assert not (await communicator.connect())[0]


async def _connect(user: User, path: str) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    communicator.scope["user"] = user
    assert (await communicator.connect())[0]
    return communicator
