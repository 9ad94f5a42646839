from __future__ import annotations

from django.contrib import admin

from core.ascii_forms import AsciiDigitsAdmin
from jobs.models import Job


@admin.register(Job)
class JobAdmin(AsciiDigitsAdmin, admin.ModelAdmin):
    list_display = ("id", "kind", "status", "progress", "created_by", "created_at", "finished_at")
    list_filter = ("status", "kind")
    readonly_fields = ("celery_id", "claim", "created_at", "started_at", "finished_at")
