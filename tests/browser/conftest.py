"""Browser-test fixtures: Debian's Chromium driven by Playwright, the real servers, signed-in pages.

Playwright is used only as a driver: the browser is ``/usr/bin/chromium`` (installed by `make
test`), never one Playwright downloads. Screenshots go to ``test-artifacts/`` (git-ignored).

Playwright's sync API keeps an event loop on this thread, which makes Django refuse ORM calls here
(async-unsafe); tests reach the database through `db_call`, which runs them on another thread.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from accounts.models import Role, User
from django.conf import settings
from django.db import connections

from tests.fleet.servers import AsgiServer

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PASSWORD = "browser-pw-7Hq2"

T = TypeVar("T")


def db_call(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` (ORM work) on a fresh thread and return its result."""

    def run() -> T:
        try:
            return fn(*args)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result()


@pytest.fixture
def users(transactional_db: None) -> dict[str, User]:
    return {
        "admin": User.objects.create_user("ada", password=PASSWORD, role=Role.ADMIN),
        "viewer": User.objects.create_user("vic", password=PASSWORD, role=Role.VIEWER),
    }


@pytest.fixture
def server(transactional_db: None) -> Iterator[AsgiServer]:
    # Jobs the server enqueues must reach this run's queue, where the test's worker listens.
    server = AsgiServer(
        CELERY_QUEUE=settings.CELERY_TASK_DEFAULT_QUEUE, CELERY_BROKER_DIR=str(settings.BROKER_DIR)
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def browser() -> Iterator[Any]:
    if shutil.which("chromium") is None and not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (make test installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def sign_in(browser: Any, base_url: str, username: str, path: str = "/") -> Any:
    """A new page signed in as ``username`` through the login form, showing ``path``."""
    page = browser.new_context(base_url=base_url, viewport={"width": 1400, "height": 1000}).new_page()
    page.set_default_timeout(30_000)
    page.goto(path)
    assert "/accounts/login/" in page.url  # anonymous visitors are sent to the login page
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}{path}")
    return page
