"""The Celery application.

Start a worker with ``celery -A config.celery worker`` from a shell where platform/ is on
``PYTHONPATH`` (scripts/run_local.py and docker/ do this). Configuration comes from Django settings
(``CELERY_*``): the broker is ``CELERY_BROKER_URL`` (RabbitMQ, say) when set, else Redis when
``REDIS_URL`` is set, otherwise kombu's filesystem broker under var/.
"""

from __future__ import annotations

import os

from celery import Celery

from config.env import env_str
from config.paths import ensure_source_roots

ensure_source_roots()
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Celery reads CELERY_BROKER_URL from the environment itself, ahead of the settings (its
# Settings.broker_url), and untrimmed: " " was a host named " ", "amqp://h// " the vhost "/ ".
# Trimmed as the settings read it ("" is unset there and to Celery), both name the same broker.
if "CELERY_BROKER_URL" in os.environ:
    os.environ["CELERY_BROKER_URL"] = env_str("CELERY_BROKER_URL")

# DjangoTask adds delay_on_commit / apply_async_on_commit.
app = Celery("platform", task_cls="celery.contrib.django.task:DjangoTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
