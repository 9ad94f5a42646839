"""With REDIS_URL, failed sign-ins count in Redis, once for every process, on a database of their own.

The tests that need Redis run in CI's second pass (REDIS_URL set) and skip without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from accounts.login_limits import SignInLocked
from accounts.models import User
from django.conf import settings
from django.contrib.auth import authenticate
from django.core.cache import cache
from django.test import Client, RequestFactory, override_settings

ROOT = Path(__file__).resolve().parents[2]
needs_redis = pytest.mark.skipif(not settings.REDIS_URL, reason="the production path: needs REDIS_URL")


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full_env = {
        **{k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "CACHE_URL")},
        "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}",
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "config.settings"),
        **env,
    }
    return subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, check=False, cwd=ROOT
    )


def cache_settings(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    code = (
        "import json; from django.conf import settings as s; c = s.CACHES['default']; "
        "print(json.dumps({'backend': c['BACKEND'], 'location': c.get('LOCATION', '')}))"
    )
    out = run_python(code, {"VAR_DIR": str(tmp_path), **env})
    if out.returncode != 0:
        return {"error": out.stderr}
    result: dict[str, str] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


REDIS_CACHE = "django.core.cache.backends.redis.RedisCache"


@pytest.mark.parametrize(
    ("env", "location"),
    [
        ({"REDIS_URL": "redis://cache:6379/0"}, "redis://cache:6379/1"),
        ({"REDIS_URL": "redis://cache:6379"}, "redis://cache:6379/1"),
        (
            {"REDIS_URL": "rediss://:pw@cache:6380/4?ssl_cert_reqs=none"},
            "rediss://:pw@cache:6380/5?ssl_cert_reqs=none",
        ),
        ({"REDIS_URL": "redis://cache:6379/0?db=2"}, "redis://cache:6379/3"),
        ({"REDIS_URL": "unix:///run/redis.sock?db=2"}, "unix:///run/redis.sock?db=3"),
        ({"REDIS_URL": "redis://cache:6379/0", "CACHE_URL": "redis://other:6379/0"}, "redis://other:6379/0"),
    ],
)
def test_with_redis_url_the_cache_is_redis_on_a_database_of_its_own(
    env: dict[str, str], location: str, tmp_path: Path
) -> None:
    assert cache_settings(env, tmp_path) == {"backend": REDIS_CACHE, "location": location}


def test_without_redis_url_the_cache_is_local_memory(tmp_path: Path) -> None:
    assert cache_settings({}, tmp_path)["backend"] == "django.core.cache.backends.locmem.LocMemCache"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"REDIS_URL": "redis://cache:6379/2", "CACHE_URL": "redis://cache:6379?db=2"},
            "CACHE_URL='redis://cache:6379?db=2' is REDIS_URL's database",
        ),
        ({"REDIS_URL": "redis://cache:6379/x"}, "REDIS_URL='redis://cache:6379/x': database index 'x'"),
        ({"REDIS_URL": "redis://cache:6379/15"}, "REDIS_URL='redis://cache:6379/15' uses database 15"),
        ({"CACHE_URL": "memcached://cache:11211"}, "CACHE_URL='memcached://cache:11211' must start with"),
    ],
)
def test_it_refuses_a_cache_url_it_cannot_use(env: dict[str, str], message: str, tmp_path: Path) -> None:
    assert message in cache_settings(env, tmp_path).get("error", "")


@needs_redis
def test_clearing_the_cache_leaves_celerys_and_the_channel_layers_redis_database() -> None:
    assert settings.CACHES["default"]["BACKEND"] == REDIS_CACHE
    layer: dict[str, Any] = settings.CHANNEL_LAYERS["default"]
    assert [h["address"] for h in layer["CONFIG"]["hosts"]] == [settings.REDIS_URL]
    assert settings.CELERY_BROKER_URL == settings.REDIS_URL
    shared = redis.Redis.from_url(settings.REDIS_URL)
    cached = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    assert (
        shared.connection_pool.connection_kwargs.get("db", 0)
        != cached.connection_pool.connection_kwargs["db"]
    )
    probe = f"test-login-limits-probe-{os.getpid()}"
    shared.set(probe, "kept", ex=60)
    try:
        cache.set("a-cached-key", 1)
        cache.clear()
        assert cache.get("a-cached-key") is None
        assert shared.get(probe) == b"kept"
    finally:
        shared.delete(probe)
        shared.close()
        cached.close()


@needs_redis
@pytest.mark.django_db
def test_failures_counted_in_another_process_lock_this_one(bob: User) -> None:
    """Another web process takes bob's five failures from one address: this one refuses him there."""
    code = (
        "import django; django.setup(); from django.test import RequestFactory; "
        "from accounts import login_limits; "
        "request = RequestFactory(REMOTE_ADDR='198.51.100.9').post('/accounts/login/'); "
        "[login_limits.begin_attempt(request, 'bob').failed() for _ in range(5)]"
    )
    out = run_python(code, {"REDIS_URL": settings.REDIS_URL or ""})
    assert out.returncode == 0, out.stderr

    refused = Client(REMOTE_ADDR="198.51.100.9").post(
        "/accounts/login/", {"username": "bob", "password": "bob-pw-9f2k"}
    )
    assert "Too many failed sign-ins for this username from this address" in refused.content.decode()
    client = Client(REMOTE_ADDR="10.0.0.1")
    client.post("/accounts/login/", {"username": "bob", "password": "bob-pw-9f2k"})
    assert "_auth_user_id" in client.session


@needs_redis
@pytest.mark.django_db
@override_settings(LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS=2, LOGIN_FAILURES_PER_ADDRESS=3)
def test_every_count_expires_with_its_window_even_if_it_expired_mid_increment(
    bob: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Django's RedisCache.incr() is EXISTS then INCRBY: a count that expires (or a success deletes)
    in between comes back from INCRBY with no expiry, and would stay forever."""
    counts = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    exists = redis.Redis.exists

    def expires_after_exists(self: redis.Redis, *names: Any) -> Any:
        found = exists(self, *names)
        self.delete(*names)
        return found

    monkeypatch.setattr(redis.Redis, "exists", expires_after_exists)
    # Failures, sign-ins refused (and taken back), successes (taken back from the address's count).
    for address, password in [("10.0.0.1", "guess")] * 4 + [("10.0.0.2", "bob-pw-9f2k")] * 2:
        request = RequestFactory().post("/accounts/login/", REMOTE_ADDR=address)
        with contextlib.suppress(SignInLocked):
            authenticate(request, username="bob", password=password)
    monkeypatch.undo()

    try:
        keys = [k for k in counts.scan_iter(match="*signin-failures:*") if b":generation" not in k]
        assert len(keys) >= 4  # the windows' starts and their counts
        assert {key: 0 < counts.ttl(key) <= 900 for key in keys} == dict.fromkeys(keys, True)
    finally:
        counts.close()
