"""The jobs page's history: ``/jobs/`` lists the newest ``JOBS_SHOWN`` jobs, live; ``?page=2``, 3, ...
the older ones, ``JOBS_SHOWN`` a page, newest first (page numbers as the REST API's ``?page=``).

A page of older jobs streams its own rows only (the jobs socket's ``?through=<pk>``: its newest
job): it updates their status and progress but never lists a job created since it was loaded. As
with the API's pages, page N's jobs move to page N+1 as new jobs are created.
"""

from __future__ import annotations

from typing import Any

from django.core.paginator import EmptyPage, Paginator
from django.urls import reverse
from jobs.models import Job

from core import ids
from dashboard import snapshots
from dashboard.forms import shown


class PageRefused(Exception):
    """A ``?page=`` that names no page; ``status``: 400 for a value that is not a page number, 404 for
    a number past the last page."""

    def __init__(self, message: str, status: int, pages: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.pages = pages  # the jobs' page count, where it was read


def page_number(raw: str | None) -> int | None:
    """The page ``?page=`` names: 1 when absent, None when too long to be a page there is. Raises
    `PageRefused` (400) for anything but a whole number from 1 on."""
    if raw is None:
        return 1
    if not ids.is_digits(raw):
        raise PageRefused(f"Not a page number: {shown(raw)}. Pages of jobs are numbered 1, 2, 3…", 400)
    number = ids.parse_pk(raw)
    if number is None:
        return None  # more digits than any page number there is
    if number < 1:
        raise PageRefused(f"No page {number}: pages of jobs are numbered from 1.", 400)
    return number


def jobs_page(raw: str | None) -> dict[str, Any]:
    """The jobs page's context for page ``raw`` (``?page=``; newest first): ``jobs`` and ``pager``,
    the links to newer and older jobs and the page's socket. Raises `PageRefused`: 400 for a value
    that is no page number, 404 for one past the last page; page 1 exists without jobs ("No jobs
    yet.")."""
    number = page_number(raw)
    paginator = Paginator(Job.objects.order_by("-pk"), snapshots.JOBS_SHOWN)
    try:
        if number is None:
            raise EmptyPage
        page = paginator.page(number)
    except EmptyPage:
        pages = paginator.num_pages
        named = number if number is not None else shown(raw or "")
        raise PageRefused(
            f"No page {named}: the jobs fill {pages} page{'s' if pages != 1 else ''}.", 404, pages
        ) from None
    number = page.number
    jobs = list(page.object_list)
    base = reverse("dashboard:jobs")
    socket = "/ws/dashboard/jobs/"
    if number > 1:  # older jobs: this page's rows, never the newest (its first job is the newest)
        socket += f"?through={jobs[0].pk}"
    pager = {
        "number": number,
        "pages": paginator.num_pages,
        "older": number > 1,
        "newer_url": None if number == 1 else base if number == 2 else f"{base}?page={number - 1}",
        "older_url": f"{base}?page={number + 1}",
        "has_older": page.has_next(),
        "socket": socket,
        "url": base if number == 1 else f"{base}?page={number}",
    }
    return {"jobs": jobs, "pager": pager, "jobs_shown": snapshots.JOBS_SHOWN}
