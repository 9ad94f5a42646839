"""Settings: typed env helpers, the local secret key, and the production switches."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import Client, override_settings
from kombu import Connection

from config.env import env_bool, env_float, env_int, env_list, env_url
from config.local_secret import load_or_create_secret_key

ROOT = Path(__file__).resolve().parents[2]


def test_it_parses_typed_values_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_BOOL", "Yes")
    monkeypatch.setenv("X_INT", "7")
    monkeypatch.setenv("X_FLOAT", "2.5")
    monkeypatch.setenv("X_LIST", "a, b,,c")
    monkeypatch.setenv("X_EMPTY", "  ")
    assert env_bool("X_BOOL") is True
    assert env_int("X_INT", 1) == 7
    assert env_float("X_FLOAT", 0.0) == 2.5
    assert env_list("X_LIST", []) == ["a", "b", "c"]
    assert env_int("X_EMPTY", 3) == 3
    assert env_bool("X_UNSET_ANYWHERE", False) is False


@pytest.mark.parametrize(
    ("value", "read"),
    [
        ("maybe", lambda: env_bool("X")),
        ("seven", lambda: env_int("X", 1)),
        ("0", lambda: env_int("X", 1, minimum=1)),
        ("fast", lambda: env_float("X", 1.0)),
        ("mysql://db", lambda: env_url("X", ("postgres",))),
    ],
)
def test_it_raises_improperly_configured_on_bad_values(
    monkeypatch: pytest.MonkeyPatch, value: str, read: object
) -> None:
    monkeypatch.setenv("X", value)
    with pytest.raises(ImproperlyConfigured, match=f"X={value!r}|X=0"):
        read()  # type: ignore[operator]


def test_it_creates_the_secret_key_once_and_privately(tmp_path: Path) -> None:
    path = tmp_path / "var" / "secret_key"
    first = load_or_create_secret_key(path)
    assert len(first) >= 50
    assert load_or_create_secret_key(path) == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def _run_with_settings(
    code: str, env: dict[str, str], unset: tuple[str, ...], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter with the platform's settings, `unset` removed from this
    environment and `env` added."""
    full_env = {
        **{k: v for k, v in os.environ.items() if k not in unset},
        "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "VAR_DIR": str(tmp_path),
        **env,
    }
    return subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, check=False, cwd=ROOT
    )


def _settings_in_subprocess(env: dict[str, str], tmp_path: Path) -> dict[str, object]:
    code = (
        "import json; from django.conf import settings as s; "
        "print(json.dumps({'engine': s.DATABASES['default']['ENGINE'], 'broker': s.CELERY_BROKER_URL, "
        "'layer': s.CHANNEL_LAYERS['default']['BACKEND'], 'debug': s.DEBUG, 'secret': s.SECRET_KEY, "
        "'results': s.CELERY_RESULT_BACKEND, 'transport': s.CELERY_BROKER_TRANSPORT_OPTIONS}))"
    )
    unset = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "SECRET_KEY", "DEBUG")
    out = _run_with_settings(code, env, unset, tmp_path)
    if out.returncode != 0:
        return {"error": out.stderr}
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_it_defaults_to_the_embedded_backends(tmp_path: Path) -> None:
    local = _settings_in_subprocess({}, tmp_path)
    assert local["engine"] == "django.db.backends.sqlite3"
    assert local["broker"] == "filesystem://localhost//"
    # kombu warns "No hostname was supplied" at every connection to a URL without one.
    assert Connection(local["broker"]).hostname == "localhost"
    assert local["layer"] == "channels.layers.InMemoryChannelLayer"
    assert local["debug"] is False
    assert local["secret"] == (tmp_path / "secret_key").read_text().strip()


def test_it_switches_to_postgres_and_redis(tmp_path: Path) -> None:
    prod = _settings_in_subprocess(
        {
            "DATABASE_URL": "postgres://u:p@db:5432/platform",
            "REDIS_URL": "redis://cache:6379/1",
            "SECRET_KEY": "k" * 60,
        },
        tmp_path,
    )
    assert prod["engine"] == "django.db.backends.postgresql"
    assert prod["broker"] == "redis://cache:6379/1"
    assert prod["layer"] == "channels_redis.core.RedisChannelLayer"
    assert prod["secret"] == "k" * 60


AMQP_OPTIONS = {"confirm_publish": True, "read_timeout": 3.0, "write_timeout": 3.0}
REDIS_OPTIONS = {"socket_timeout": 3.0, "socket_connect_timeout": 3.0}
IN_MEMORY = "channels.layers.InMemoryChannelLayer"
REDIS_LAYER = "channels_redis.core.RedisChannelLayer"


@pytest.mark.parametrize(
    ("env", "broker", "transport", "results", "layer"),
    [
        # Alone, the broker changes and the rest stays embedded: no results, in-memory channels.
        (
            {"CELERY_BROKER_URL": "amqp://u:p@rabbit:5672//"},
            "amqp://u:p@rabbit:5672//",
            AMQP_OPTIONS,
            None,
            IN_MEMORY,
        ),
        (
            {"CELERY_BROKER_URL": "amqps://u:p@rabbit:5671/v"},
            "amqps://u:p@rabbit:5671/v",
            AMQP_OPTIONS,
            None,
            IN_MEMORY,
        ),
        ({"CELERY_BROKER_URL": "pyamqp://rabbit//"}, "pyamqp://rabbit//", AMQP_OPTIONS, None, IN_MEMORY),
        (
            {"CELERY_BROKER_URL": "rediss://:pw@q:6380/2"},
            "rediss://:pw@q:6380/2",
            REDIS_OPTIONS,
            None,
            IN_MEMORY,
        ),
        # With REDIS_URL, Redis keeps the results and the channel layer.
        (
            {"CELERY_BROKER_URL": "amqp://rabbit//", "REDIS_URL": "redis://cache:6379/1"},
            "amqp://rabbit//",
            AMQP_OPTIONS,
            "redis://cache:6379/1",
            REDIS_LAYER,
        ),
        (
            {"REDIS_URL": "redis://cache:6379/1"},
            "redis://cache:6379/1",
            REDIS_OPTIONS,
            "redis://cache:6379/1",
            REDIS_LAYER,
        ),
    ],
)
def test_celery_broker_url_overrides_the_broker_alone(
    tmp_path: Path,
    env: dict[str, str],
    broker: str,
    transport: dict[str, object],
    results: str | None,
    layer: str,
) -> None:
    got = _settings_in_subprocess(env, tmp_path)
    assert (got.get("broker"), got.get("transport")) == (broker, transport), got
    assert (got["results"], got["layer"]) == (results, layer)


@pytest.mark.parametrize(
    ("value", "broker"),
    [(" ", "filesystem://localhost//"), ("amqp://u:p@rabbit// ", "amqp://u:p@rabbit//")],
)
def test_celery_uses_the_broker_the_settings_read(tmp_path: Path, value: str, broker: str) -> None:
    # Celery reads CELERY_BROKER_URL itself: it used " " (a host named " ") and the vhost "/ ".
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(PYTHONPATH=f"{ROOT / 'platform'}{os.pathsep}{ROOT}", VAR_DIR=str(tmp_path))
    env["CELERY_BROKER_URL"] = value
    code = "from config.celery import app; print(app.conf.broker_url)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == broker


def test_it_refuses_to_start_with_a_bad_setting(tmp_path: Path) -> None:
    bad = _settings_in_subprocess({"DEBUG": "perhaps"}, tmp_path)
    assert "ImproperlyConfigured" in str(bad["error"]) and "DEBUG='perhaps'" in str(bad["error"])


def test_it_refuses_a_bad_connection_age_without_database_url_too(tmp_path: Path) -> None:
    # It was read only with DATABASE_URL: locally "abc" started fine, in production it stopped start-up.
    bad = _settings_in_subprocess({"DB_CONN_MAX_AGE": "abc"}, tmp_path)
    assert "ImproperlyConfigured" in str(bad["error"]) and "DB_CONN_MAX_AGE='abc'" in str(bad["error"])


def test_it_refuses_a_job_silence_limit_a_healthy_job_could_reach(tmp_path: Path) -> None:
    # A job stamped every 10 s and failed as lost after 3 s of silence would be "lost" while healthy.
    bad = _settings_in_subprocess({"JOBS_HEARTBEAT_S": "10", "JOBS_LOST_AFTER_S": "3"}, tmp_path)
    assert "ImproperlyConfigured" in str(bad["error"]) and "JOBS_LOST_AFTER_S=3.0" in str(bad["error"])
    ok = _settings_in_subprocess({"JOBS_HEARTBEAT_S": "10", "JOBS_LOST_AFTER_S": "25"}, tmp_path)
    assert "error" not in ok, ok


@pytest.mark.django_db
def test_it_has_no_missing_migrations() -> None:
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def register_host(
    env: dict[str, str], prefix: list[str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``manage.py register_host gpu-1`` run with ``env`` (after ``prefix``: another user, say)."""
    return subprocess.run(
        [*(prefix or []), sys.executable, str(ROOT / "manage.py"), "register_host", "gpu-1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("DATABASE_URL", "abc", "DATABASE_URL='abc' must start with one of"),
        ("DEBUG", "perhaps", "DEBUG='perhaps' is not a boolean"),
        ("DJANGO_SETTINGS_MODULE", "config.nope", "settings module 'config.nope' (--settings) cannot be"),
        # These two were a NotADirectoryError / FileNotFoundError traceback naming no variable.
        ("VAR_DIR", "/dev/null/var", "VAR_DIR='/dev/null/var' cannot be a directory: /dev/null is not one"),
        ("VAR_DIR", "/proc/platform-var", "VAR_DIR='/proc/platform-var': the generated SECRET_KEY cannot be"),
        ("CELERY_BROKER_DIR", "/dev/null/b", "CELERY_BROKER_DIR='/dev/null/b' cannot be a directory"),
        (
            "CELERY_BROKER_URL",
            "kafka://q:9092",
            "CELERY_BROKER_URL='kafka://q:9092' must start with one of amqp,",
        ),
        (
            "CELERY_BROKER_URL",
            "rabbit:5672",
            "CELERY_BROKER_URL='rabbit:5672' must start with one of amqp, amqps,",
        ),
    ],
)
def test_manage_py_names_a_bad_setting_in_one_line(
    tmp_path: Path, variable: str, value: str, named: str
) -> None:
    # It was a traceback through Django's command loading, ending in ImproperlyConfigured.
    env = {**os.environ, "VAR_DIR": str(tmp_path), variable: value}
    env.pop("PYTEST_VERSION", None)
    env.pop("SECRET_KEY", None)  # the local one, kept in VAR_DIR
    out = register_host(env)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith(f"manage.py: error: {named}") and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        # With SECRET_KEY set (as in production) nothing is written to VAR_DIR before its static
        # folder, nor to CELERY_BROKER_DIR before its queue folders: each a FileNotFoundError traceback.
        ("VAR_DIR", "/proc/platform-var", "VAR_DIR='/proc/platform-var': "),
        ("CELERY_BROKER_DIR", "/proc/platform-broker", "CELERY_BROKER_DIR='/proc/platform-broker': "),
    ],
)
def test_manage_py_names_an_unwritable_directory_with_secret_key_set(
    tmp_path: Path, variable: str, value: str, named: str
) -> None:
    env = {**os.environ, "VAR_DIR": str(tmp_path), variable: value, "SECRET_KEY": "k" * 50}
    for name in ("PYTEST_VERSION", "REDIS_URL", "CELERY_BROKER_URL"):
        env.pop(name, None)  # the embedded broker, whose folders are made at start-up
    out = register_host(env)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith(f"manage.py: error: {named}") and "Traceback" not in out.stderr


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="runs manage.py as nobody (needs root and setpriv)",
)
def test_manage_py_names_a_var_dir_it_may_not_look_into(tmp_path: Path) -> None:
    # tmp_path is root's, mode 700: nobody's stat of VAR_DIR below it is refused (EACCES), which
    # Path.exists raises as PermissionError, a traceback naming no variable.
    var_dir = tmp_path / "var"
    env = {**os.environ, "VAR_DIR": str(var_dir), "SECRET_KEY": "k" * 50}
    env.pop("PYTEST_VERSION", None)
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    out = register_host(env, as_nobody, cwd="/")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith(f"manage.py: error: VAR_DIR={str(var_dir)!r} cannot be a directory: ")
    assert "Permission denied" in out.stderr and "Traceback" not in out.stderr


def test_manage_py_keeps_the_traceback_of_a_misconfiguration_outside_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from manage import _raised_by_settings

    (tmp_path / "bad_settings.py").write_text(
        "from django.core.exceptions import ImproperlyConfigured\n"
        "raise ImproperlyConfigured('DEBUG=perhaps')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "bad_settings")
    with pytest.raises(ImproperlyConfigured) as from_settings:
        __import__("bad_settings")
    assert _raised_by_settings(from_settings.value)
    with pytest.raises(ImproperlyConfigured) as elsewhere:  # an app's or a command's own
        raise ImproperlyConfigured("a URLconf without patterns")
    assert not _raised_by_settings(elsewhere.value)


def _hsts_seconds(env: dict[str, str], tmp_path: Path) -> object:
    code = "from django.conf import settings as s; print(s.SECURE_HSTS_SECONDS)"
    unset = ("SECURE_COOKIES", "SECURE_HSTS_SECONDS", "BEHIND_TLS_PROXY")
    out = _run_with_settings(code, env, unset, tmp_path)
    return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else out.stderr


def test_an_https_only_platform_sends_hsts(tmp_path: Path) -> None:
    """SECURE_COOKIES declares the platform HTTPS-only: its HTTPS answers then carry HSTS (a year),
    so a later plain-HTTP visit cannot be kept on HTTP; SECURE_HSTS_SECONDS overrides it (0: none)."""
    assert _hsts_seconds({}, tmp_path) == 0
    assert _hsts_seconds({"SECURE_COOKIES": "true", "BEHIND_TLS_PROXY": "true"}, tmp_path) == 31536000
    assert _hsts_seconds({"SECURE_COOKIES": "true", "SECURE_HSTS_SECONDS": "0"}, tmp_path) == 0
    assert _hsts_seconds({"SECURE_HSTS_SECONDS": "600"}, tmp_path) == 600


@pytest.mark.django_db
@override_settings(SECURE_HSTS_SECONDS=31536000)
def test_the_hsts_setting_reaches_https_answers(client: Client) -> None:
    assert client.get("/api/health/", secure=True)["Strict-Transport-Security"] == "max-age=31536000"
    assert "Strict-Transport-Security" not in client.get("/api/health/")  # plain HTTP: none
