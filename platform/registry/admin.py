from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.forms import ModelForm
from django.http import HttpRequest

from registry.models import ServedModel
from registry.services import update_served_model


@admin.register(ServedModel)
class ServedModelAdmin(admin.ModelAdmin):
    list_display = ("name", "source", "dtype", "tensor_parallel_size", "slo_ttft_p99_ms", "slo_tbt_p99_ms")

    def save_model(self, request: HttpRequest, obj: ServedModel, form: ModelForm, change: bool) -> None:
        """An edit goes through `update_served_model`, like the API's: an edit of the engine
        settings leaves the model's running deployments pending until their agents restart them."""
        if not change:
            super().save_model(request, obj, form, change)
            return
        changes: dict[str, Any] = {name: form.cleaned_data[name] for name in form.changed_data}
        update_served_model(obj, changes)
