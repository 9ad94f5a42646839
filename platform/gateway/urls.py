"""The chat playground (the /v1 API itself is a plain ASGI app mounted in config/asgi.py)."""

from __future__ import annotations

from django.urls import path

from gateway import views

app_name = "gateway"

urlpatterns = [
    path("playground/", views.playground, name="playground"),
    path("playground/key/", views.playground_key, name="playground-key"),
]
