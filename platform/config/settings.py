"""Django settings for the control plane.

Local default (nothing to configure): SQLite under var/, Celery on kombu's filesystem broker under
var/broker, Channels' in-memory layer, a SECRET_KEY generated once into var/. Production switches:

- ``DATABASE_URL``  PostgreSQL (or any dj-database-url URL) instead of SQLite.
- ``REDIS_URL``     Celery broker + result backend, the channels_redis layer, and (on the next
  database index, or ``CACHE_URL``) the cache that counts failed sign-ins across processes.
- ``CELERY_BROKER_URL``  another broker for Celery's messages (RabbitMQ: ``amqp://``); results and
  the channel layer stay on ``REDIS_URL`` (without it: none, and in-memory, as embedded).
- ``SECRET_KEY``    required to be stable across hosts; ``DEBUG``, ``ALLOWED_HOSTS``,
  ``CSRF_TRUSTED_ORIGINS`` and the rest are read below with typed helpers.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit, urlunsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_dir, env_float, env_int, env_list, env_str, env_url
from config.local_secret import load_or_create_secret_key

ROOT_DIR = Path(__file__).resolve().parents[2]  # repository root
BASE_DIR = ROOT_DIR / "platform"  # Django source root (not a package)
VAR_DIR = env_dir("VAR_DIR", ROOT_DIR / "var")

# pytest sets PYTEST_VERSION while it runs; tests get their own database file and broker queue so
# that a test run never touches the data of a `make run` in the same checkout.
TESTING = "PYTEST_VERSION" in os.environ

DEBUG = env_bool("DEBUG", False)


def _local_secret_key() -> str:
    try:
        return load_or_create_secret_key(VAR_DIR / "secret_key")
    except OSError as error:  # VAR_DIR not writable: an ImproperlyConfigured names it, not a traceback
        raise ImproperlyConfigured(
            f"VAR_DIR={str(VAR_DIR)!r}: the generated SECRET_KEY cannot be kept there ({error.strerror});"
            " set VAR_DIR to a writable directory"
        ) from None


SECRET_KEY = env_str("SECRET_KEY") or _local_secret_key()


def _make_dir(path: Path, variable: str, value: Path) -> None:
    """Makes ``path`` (under ``variable``'s directory ``value``); one that cannot be names it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # with SECRET_KEY set nothing was written there before: no traceback
        raise ImproperlyConfigured(
            f"{variable}={str(value)!r}: {path} cannot be made ({error.strerror});"
            f" set {variable} to a writable directory"
        ) from None


ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("BEHIND_TLS_PROXY") else None
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("SECURE_COOKIES", False)
# HSTS: with SECURE_COOKIES the platform is declared HTTPS-only, so its HTTPS answers tell browsers
# to use nothing else for a year (Django's SecurityMiddleware sends the header on secure requests
# only: behind a proxy, with BEHIND_TLS_PROXY). Without it a user's first plain-HTTP visit (a typed
# host name, an http:// link) could be intercepted and kept on HTTP, session cookie and password
# included. SECURE_HSTS_SECONDS sets the time (0: no header); browsers keep it that long.
SECURE_HSTS_SECONDS = env_int(
    "SECURE_HSTS_SECONDS", 365 * 24 * 3600 if SESSION_COOKIE_SECURE else 0, minimum=0
)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "core",
    "accounts",
    "registry",
    "inventory",
    "deployments",
    "jobs",
    "agents",
    "planning",
    "gateway",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "core.middleware.ServiceUnavailableMiddleware",  # pages' 503 when the database or Redis is down
    "core.middleware.MethodNotAllowedPageMiddleware",  # a page, not an empty 405, for a GET of a form address
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [ROOT_DIR / "frontend" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database ---------------------------------------------------------------------------------
DATABASE_URL = env_url("DATABASE_URL", ("postgres", "postgresql", "pgsql", "sqlite"))
SQLITE_PATH = VAR_DIR / "db.sqlite3"
# Read whatever the database (SQLite keeps no connection pool): a bad value fails here too, not
# only once DATABASE_URL is set in production.
DB_CONN_MAX_AGE = env_int("DB_CONN_MAX_AGE", 60, minimum=0)
DATABASES: dict[str, dict[str, Any]]
if DATABASE_URL:
    DATABASES = {"default": dict(dj_database_url.parse(DATABASE_URL, conn_max_age=DB_CONN_MAX_AGE))}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(SQLITE_PATH),
            "OPTIONS": {
                # The web server and the worker write from different processes: wait for the lock
                # instead of failing, take it up front, and let readers proceed during writes.
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            # A file, not ":memory:", so that a Celery worker subprocess sees the test database.
            "TEST": {"NAME": str(VAR_DIR / f"test-db-{os.getpid()}.sqlite3")},
        }
    }
# DJANGO_DB_NAME points a process at another database of the same server/directory: the test
# suite uses it to hand its test database to the worker subprocess it starts.
if env_str("DJANGO_DB_NAME"):
    DATABASES["default"]["NAME"] = env_str("DJANGO_DB_NAME")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_USER_MODEL = "accounts.User"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
if TESTING:
    # Test users are created per test; the production hasher's work factor would dominate the run.
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Failed sign-ins (accounts/login_limits.py), on the sign-in page, the admin's and the token endpoint:
# a username from one client address with LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS failures, an
# address with LOGIN_FAILURES_PER_ADDRESS (across usernames), or a username with
# LOGIN_FAILURES_PER_USERNAME (from every address: high, or anyone could lock its owner out), within
# LOGIN_FAILURE_WINDOW_S of its first is refused until the window ends. Counted in the default cache
# (CACHES below); `manage.py clear_login_limits` forgets counts.
AUTHENTICATION_BACKENDS = ["accounts.backends.RateLimitedModelBackend"]
LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS = env_int("LOGIN_FAILURES_PER_USERNAME_AND_ADDRESS", 5, minimum=1)
LOGIN_FAILURES_PER_USERNAME = env_int("LOGIN_FAILURES_PER_USERNAME", 100, minimum=1)
LOGIN_FAILURES_PER_ADDRESS = env_int("LOGIN_FAILURES_PER_ADDRESS", 20, minimum=1)
LOGIN_FAILURE_WINDOW_S = env_int("LOGIN_FAILURE_WINDOW_S", 900, minimum=1)
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "dashboard:overview"  # the dashboard's home, after signing in without ?next=
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "static"
_make_dir(STATIC_ROOT, "VAR_DIR", VAR_DIR)  # WhiteNoise warns about a missing root
# Serve app static files straight from their apps (no collectstatic step for `make run`).
WHITENOISE_USE_FINDERS = True
STATICFILES_DIRS = [ROOT_DIR / "frontend" / "static"]
WHITENOISE_AUTOREFRESH = DEBUG

# --- REST API ---------------------------------------------------------------------------------
REST_FRAMEWORK = {
    # Token first: its WWW-Authenticate header makes anonymous requests 401 rather than 403.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["core.permissions.RolePermission"],
    "DEFAULT_PARSER_CLASSES": [
        "core.api.errors.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "EXCEPTION_HANDLER": "core.api.errors.exception_handler",
    "DEFAULT_PAGINATION_CLASS": "core.api.pagination.PageNumberPagination",
    "PAGE_SIZE": env_int("API_PAGE_SIZE", 50, minimum=1),
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "LLM serving platform API",
    "DESCRIPTION": "Control plane: served models, hosts and GPUs, deployments, jobs, API keys.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and Swagger UI need an account like the API they describe (any role reads).
    "SERVE_PERMISSIONS": ["core.permissions.RolePermission"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
}

# --- Celery + Channels ------------------------------------------------------------------------
REDIS_URL = env_url("REDIS_URL", ("redis", "rediss", "unix"))
# CELERY_BROKER_URL moves Celery's messages to another broker, RabbitMQ say; the result backend and
# the channel layer stay on REDIS_URL, or without it off and in-memory, as in the embedded mode.
AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")
_BROKER_URL = env_url("CELERY_BROKER_URL", (*AMQP_SCHEMES, "redis", "rediss"))
# (Celery reads the variable itself too: config/celery.py trims it the way it is read here.)
# Each test run gets its own throwaway broker folder (tests/control_plane/conftest.py removes it):
# workers started by tests leave fanout bindings behind that would otherwise pile up across runs.
_TEST_BROKER_DIR = Path(tempfile.gettempdir()) / "platform-test-broker" / str(os.getpid())
BROKER_DIR = env_dir("CELERY_BROKER_DIR", _TEST_BROKER_DIR if TESTING else VAR_DIR / "broker")
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_QUEUE", f"test-{os.getpid()}" if TESTING else "celery")
CELERY_TASK_SERIALIZER = CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 6 * 3600, minimum=1)
# A publish (a new job's message, a revoke) gives up within seconds when the broker cannot take
# it, so that starting a job answers 503 (jobs.services.create_job: BrokerUnavailable) instead of
# holding the request. Celery's defaults bound only a broker that refuses: against a Redis that
# accepts connections but never answers (a partition, a blackholing firewall) kombu's sockets had
# no timeout and the publish waited for ever. Now each connect and each read waits at most
# BROKER_TIMEOUT_S (the transport options below), connecting gives up after one such wait
# (broker_connection_timeout), and a failed publish is retried once, at once (a pooled connection
# that Redis closed on restart is stale: the retry reconnects). Measured against such a Redis: a
# fresh connection fails in BROKER_TIMEOUT_S, a pooled one in three times that; RabbitMQ the same.
BROKER_TIMEOUT_S = 3.0
CELERY_BROKER_CONNECTION_TIMEOUT = BROKER_TIMEOUT_S
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.2,
}
# The embedded broker's host part names nothing (its folders below are the broker); without one
# kombu warns "No hostname was supplied" at every connection (each job submitted, each worker start).
_EMBEDDED_BROKER_URL = "filesystem://localhost//"
CELERY_BROKER_URL = _BROKER_URL or REDIS_URL or _EMBEDDED_BROKER_URL
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any]
if CELERY_BROKER_URL.split("://", 1)[0].lower() in AMQP_SCHEMES:
    # kombu passes these to py-amqp's Connection. An AMQP publish is not answered: to a RabbitMQ
    # that stopped answering on a pooled connection it went into the socket's buffer, the POST got
    # a 201 and the job's message was lost. With publisher confirms each publish waits for the
    # broker's ack, for at most read_timeout (SO_RCVTIMEO; write_timeout is SO_SNDTIMEO): measured,
    # such a POST answers 503 in 9 s and keeps no row. The worker reads only when its event loop
    # finds the socket readable, so an idle worker is not cut off by these timeouts.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "confirm_publish": True,
        "read_timeout": BROKER_TIMEOUT_S,
        "write_timeout": BROKER_TIMEOUT_S,
    }
elif CELERY_BROKER_URL != _EMBEDDED_BROKER_URL:
    # The worker's waits for messages are BRPOPs read by its event loop when a reply arrives, not
    # blocking reads: these timeouts do not cut them short (kombu checks a silent BRPOP itself).
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "socket_timeout": BROKER_TIMEOUT_S,
        "socket_connect_timeout": BROKER_TIMEOUT_S,
    }
else:
    # Embedded: a real broker shared by processes through files.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "control_folder": str(BROKER_DIR / "control"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "store_processed": False,
    }
    for _folder in ("queue", "control", "processed"):
        _make_dir(BROKER_DIR / _folder, "CELERY_BROKER_DIR", BROKER_DIR)
if REDIS_URL:
    CELERY_RESULT_BACKEND: str | None = REDIS_URL
    # The layer waits for messages with a blocking pop, 5 s at a time (channels_redis'
    # brpop_timeout). redis-py 8's default 5 s socket timeout cut those waits short: every idle
    # websocket closed with 1011 every 5-6 s. So no socket timeout at all, rather than a longer one:
    # with one, redis-py sends each command through asyncio.wait_for, which on Python 3.11 can
    # swallow a cancellation (CPython gh-86296), and a consumer whose receive was cancelled there
    # never ended (its socket gone, its task popping from Redis for ever; test runs hung on it).
    # Connecting still times out, and TCP keepalive notices a Redis that went away within a minute
    # (probes after 30 s idle, every 10 s, 3 unanswered end it; macOS lacks TCP_KEEPIDLE).
    _keepalive = {"TCP_KEEPIDLE": 30, "TCP_KEEPINTVL": 10, "TCP_KEEPCNT": 3}
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [
                    {
                        "address": REDIS_URL,
                        "socket_timeout": None,
                        "socket_connect_timeout": 5,
                        "socket_keepalive": True,
                        "socket_keepalive_options": {
                            getattr(socket, name): value
                            for name, value in _keepalive.items()
                            if hasattr(socket, name)
                        },
                    }
                ]
            },
        }
    }
else:
    # Task outcomes are written to the Job rows, so no result backend is needed.
    CELERY_RESULT_BACKEND = None
    CELERY_TASK_IGNORE_RESULT = True
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


# --- Cache ------------------------------------------------------------------------------------
# The default cache holds the failed sign-in counts (accounts/login_limits.py) and the token
# endpoint's throttle. With REDIS_URL (or CACHE_URL) it is Redis, one count for every web process
# and worker. It gets a Redis database of its own: CACHE_URL, by default REDIS_URL with the database
# index + 1 (redis://h:6379/0 -> redis://h:6379/1), because clearing the cache (the test suite does,
# before every test) flushes its whole database, and the channel layer and Celery keep theirs in
# REDIS_URL's. Without either: the local-memory cache, one per process (`make run`), so N processes
# allow N times the sign-in limits and a restart forgets them.
def _redis_db(name: str, url: str) -> int:
    """The database index in a Redis URL (``?db=N`` before the ``/N`` path, as redis-py reads it)."""
    parts = urlsplit(url)
    path = "" if parts.scheme == "unix" else parts.path.strip("/")
    value = parse_qs(parts.query).get("db", [path])[-1] or "0"
    if not value.isdigit():
        raise ImproperlyConfigured(f"{name}={url!r}: database index {value!r} is not a number")
    return int(value)


def _with_redis_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "db"]
    if parts.scheme == "unix":  # urlunsplit() would drop the "//" of an empty host
        return f"unix://{parts.netloc}{parts.path}?{urlencode([*query, ('db', str(db))])}"
    return urlunsplit(parts._replace(path=f"/{db}", query=urlencode(query)))


CACHE_URL = env_url("CACHE_URL", ("redis", "rediss", "unix"))
if REDIS_URL:
    _redis_db_index = _redis_db("REDIS_URL", REDIS_URL)
    if not CACHE_URL:
        if _redis_db_index >= 15:  # Redis has databases 0-15 unless configured with more
            raise ImproperlyConfigured(
                f"{REDIS_URL=} uses database {_redis_db_index}, the cache's would be past Redis's"
                " default 0-15: set CACHE_URL to a database of the cache's own"
            )
        CACHE_URL = _with_redis_db(REDIS_URL, _redis_db_index + 1)
    elif _with_redis_db(CACHE_URL, _redis_db("CACHE_URL", CACHE_URL)) == _with_redis_db(
        REDIS_URL, _redis_db_index
    ):
        raise ImproperlyConfigured(
            f"{CACHE_URL=} is REDIS_URL's database: clearing the cache would flush Celery's and the "
            "channel layer's keys"
        )
CACHES: dict[str, dict[str, Any]]
if CACHE_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": CACHE_URL}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# How long a host may stay silent before it counts as stale, then offline (seconds). Agents send a
# heartbeat every second: stale = two missed heartbeats (plus half a second of jitter).
HOST_STALE_AFTER_S = env_float("HOST_STALE_AFTER_S", 2.5, minimum=1.0)
HOST_OFFLINE_AFTER_S = env_float("HOST_OFFLINE_AFTER_S", 30.0, minimum=1.0)
if HOST_OFFLINE_AFTER_S < HOST_STALE_AFTER_S:
    raise ImproperlyConfigured(f"{HOST_OFFLINE_AFTER_S=} must be >= {HOST_STALE_AFTER_S=}")

# Agent telemetry (platform/agents): raw per-second samples kept TELEMETRY_RAW_RETENTION_S, then folded
# into per-minute rows kept TELEMETRY_HISTORY_RETENTION_S. The ASGI process sweeps liveness every
# AGENTS_SWEEP_INTERVAL_S and retention every TELEMETRY_DOWNSAMPLE_INTERVAL_S (AGENTS_SWEEP_IN_ASGI);
# Celery beat runs the same sweeps where it is started. Agent links re-read their host's desired
# deployments every AGENTS_DESIRED_POLL_S (changes made in other processes).
TELEMETRY_RAW_RETENTION_S = env_float("TELEMETRY_RAW_RETENTION_S", 600.0, minimum=60.0)
TELEMETRY_HISTORY_RETENTION_S = env_float("TELEMETRY_HISTORY_RETENTION_S", 24 * 3600.0, minimum=3600.0)
AGENTS_SWEEP_IN_ASGI = env_bool("AGENTS_SWEEP_IN_ASGI", True)
AGENTS_SWEEP_INTERVAL_S = env_float("AGENTS_SWEEP_INTERVAL_S", 1.0, minimum=0.1)
TELEMETRY_DOWNSAMPLE_INTERVAL_S = env_float("TELEMETRY_DOWNSAMPLE_INTERVAL_S", 60.0, minimum=1.0)
AGENTS_DESIRED_POLL_S = env_float("AGENTS_DESIRED_POLL_S", 2.0, minimum=0.1)
# A dashboard websocket re-checks its user every DASHBOARD_AUTH_RECHECK_S: one whose session is gone
# (signed out, expired, flushed) or whose user lost access (deactivated, role removed) is closed
# with 4401. A check reads the session and the user; the socket's own updates read more every second.
DASHBOARD_AUTH_RECHECK_S = env_float("DASHBOARD_AUTH_RECHECK_S", 5.0, minimum=0.1)
# The most dashboard websockets one user holds open at once (each re-reads the database every
# second); one more is closed with 4429. Counted in the cache: with Redis across every web process,
# else per process (N processes allow N times this). See dashboard/socket_slots.py.
DASHBOARD_SOCKETS_PER_USER = env_int("DASHBOARD_SOCKETS_PER_USER", 16, minimum=1)
# A running job's worker stamps it every JOBS_HEARTBEAT_S; one silent for JOBS_LOST_AFTER_S is failed
# as lost (jobs/liveness.py) by the beat task below and by every worker at start.
JOBS_HEARTBEAT_S = env_float("JOBS_HEARTBEAT_S", 10.0, minimum=0.1)
JOBS_LOST_AFTER_S = env_float("JOBS_LOST_AFTER_S", 120.0, minimum=1.0)
if JOBS_LOST_AFTER_S < 2.5 * JOBS_HEARTBEAT_S:  # else a healthy job between two stamps is "lost"
    raise ImproperlyConfigured(f"{JOBS_LOST_AFTER_S=} must be at least 2.5 x {JOBS_HEARTBEAT_S=}")
# Beat's own state (when each task last ran) goes with the rest of the local state: by default
# Celery writes it to the working directory, the checkout's root or the image's /app, which the
# image's user cannot write. `--schedule` still overrides it (docker/compose.yaml, make run).
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    "jobs-lost": {"task": "jobs.fail_lost_jobs", "schedule": 30.0},
    "agents-liveness": {"task": "agents.sweep_liveness", "schedule": 5.0},
    "agents-retention": {"task": "agents.downsample_telemetry", "schedule": TELEMETRY_DOWNSAMPLE_INTERVAL_S},
    "accounts-expired-tokens": {"task": "accounts.prune_api_tokens", "schedule": 3600.0},
}

# Default quotas of a new end-user API key (an admin may change them per key).
API_KEY_DEFAULT_REQUESTS_PER_MINUTE = env_int("API_KEY_DEFAULT_REQUESTS_PER_MINUTE", 60, minimum=1)
API_KEY_DEFAULT_TOKENS_PER_DAY = env_int("API_KEY_DEFAULT_TOKENS_PER_DAY", 1_000_000, minimum=1)
# Quotas are per key: without a cap on live keys a user could multiply them by creating keys.
API_KEYS_PER_USER = env_int("API_KEYS_PER_USER", 10, minimum=1)

# Operator API tokens (POST /api/v1/auth/token/): one unused for API_TOKEN_IDLE_DAYS or issued over
# API_TOKEN_MAX_AGE_DAYS ago is refused (401) and deleted by the beat task accounts.prune_api_tokens.
# Issuing one beyond API_TOKENS_PER_USER live tokens deletes the user's least recently used.
# Agent tokens (inventory) do not expire.
API_TOKEN_IDLE_DAYS = env_int("API_TOKEN_IDLE_DAYS", 30, minimum=1)
API_TOKEN_MAX_AGE_DAYS = env_int("API_TOKEN_MAX_AGE_DAYS", 90, minimum=1)
API_TOKENS_PER_USER = env_int("API_TOKENS_PER_USER", 10, minimum=1)

# Chat gateway (/v1, platform/gateway): upstream connect timeout, the longest an engine may stay
# silent mid-response, and the Retry-After sent when no replica of a model is healthy.
GATEWAY_CONNECT_TIMEOUT_S = env_float("GATEWAY_CONNECT_TIMEOUT_S", 3.0, minimum=0.1)
GATEWAY_READ_TIMEOUT_S = env_float("GATEWAY_READ_TIMEOUT_S", 600.0, minimum=1.0)
GATEWAY_UNAVAILABLE_RETRY_AFTER_S = env_int("GATEWAY_UNAVAILABLE_RETRY_AFTER_S", 5, minimum=1)
# How long a request's token reservation (its most possible cost, held against the key's daily
# quota until it finishes) counts: only a web process that died mid-request leaves one this old.
GATEWAY_RESERVATION_TTL_S = env_int("GATEWAY_RESERVATION_TTL_S", 900, minimum=1)
# The most of an engine's answer the gateway holds: a whole non-streamed answer, and one SSE event
# of a stream. An engine that misbehaves, or answers a huge n or logprobs request, must not grow a
# web process without bound; past either limit the request is cut off (a 502, or a stream's final
# error event) and recorded as failed. Sizes of legitimate answers: a generated token costs tens of
# bytes of JSON, about 1.5 KB with top-20 logprobs (vLLM's max_logprobs default). A stream's event
# holds one engine step of one choice, so 8 MiB is thousands of times a real one; 64 MiB holds about
# 40,000 tokens with top-20 logprobs each (n x max_tokens). Serving more, raise them.
GATEWAY_MAX_ENGINE_BODY_BYTES = env_int("GATEWAY_MAX_ENGINE_BODY_BYTES", 64 * 2**20, minimum=65_536)
GATEWAY_MAX_ENGINE_EVENT_BYTES = env_int("GATEWAY_MAX_ENGINE_EVENT_BYTES", 8 * 2**20, minimum=65_536)
# Engines' prefix caches are per user (the gateway salts each request with its key's owner,
# gateway/cache_salt.py) unless this is set: then every user's requests share them.
GATEWAY_SHARED_PREFIX_CACHE = env_bool("GATEWAY_SHARED_PREFIX_CACHE", False)

# Celery's routine lines about the beat schedule's tasks (sent, received, succeeded: three every
# 5 s for the liveness sweep) are dropped unless LOG_HOUSEKEEPING is set (config/log_filters.py).
HOUSEKEEPING_TASKS = (
    [] if env_bool("LOG_HOUSEKEEPING") else [e["task"] for e in CELERY_BEAT_SCHEDULE.values()]
)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"housekeeping": {"()": "config.log_filters.QuietHousekeeping", "tasks": HOUSEKEEPING_TASKS}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["housekeeping"]}
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO").upper()},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
