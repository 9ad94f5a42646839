from __future__ import annotations

from typing import Any

from deployments.admin import PlacementRefusalShown
from deployments.services import PlacementError, check_tensor_parallel_change
from django import forms
from django.contrib import admin
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from core.locked_delete_admin import LockedDeleteAdmin
from registry.models import ServedModel, lock_for_delete
from registry.services import update_served_model


class ServedModelAdminForm(forms.ModelForm):
    class Meta:
        model = ServedModel
        fields = "__all__"

    def clean_tensor_parallel_size(self) -> int:
        """The API's rule, as a form error: no size change while deployments of the model run."""
        value: int = self.cleaned_data["tensor_parallel_size"]
        if self.instance.pk is not None:
            try:
                check_tensor_parallel_change(self.instance, self.instance.tensor_parallel_size, value)
            except PlacementError as exc:
                raise forms.ValidationError(str(exc)) from exc
        return value


@admin.register(ServedModel)
class ServedModelAdmin(LockedDeleteAdmin, PlacementRefusalShown):
    form = ServedModelAdminForm
    list_display = ("name", "source", "dtype", "tensor_parallel_size", "slo_ttft_p99_ms", "slo_tbt_p99_ms")

    def lock_for_delete(self, pks: list[Any]) -> None:
        lock_for_delete(pks)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ServedModel]) -> None:
        """The bulk delete locks the models' rows first, as ``ServedModel.delete`` does."""
        with transaction.atomic():
            lock_for_delete(queryset.values_list("pk", flat=True))
            super().delete_queryset(request, queryset)

    def save_model(self, request: HttpRequest, obj: ServedModel, form: forms.ModelForm, change: bool) -> None:
        """An edit goes through `update_served_model`, like the API's: an edit of the engine
        settings leaves the model's running deployments pending until their agents restart them."""
        if not change:
            super().save_model(request, obj, form, change)
            return
        changes: dict[str, Any] = {name: form.cleaned_data[name] for name in form.changed_data}
        update_served_model(obj, changes)
