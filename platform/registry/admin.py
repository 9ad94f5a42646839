from __future__ import annotations

from django.contrib import admin

from registry.models import ServedModel


@admin.register(ServedModel)
class ServedModelAdmin(admin.ModelAdmin):
    list_display = ("name", "source", "dtype", "tensor_parallel_size", "slo_ttft_p99_ms", "slo_tbt_p99_ms")
