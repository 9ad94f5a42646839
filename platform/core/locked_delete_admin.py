"""The admin of rows that deployments protect (hosts, models): deletes checked under row locks.

Django's delete page and "Delete selected" action first look for what protects the rows
(``get_deleted_objects``), then delete them. A deployment placed between the two (placing one
holds its host's row and its model's) made the delete raise ProtectedError: a 500. Here a
confirmed delete takes the rows' locks before it looks, and holds them until the delete commits
(the delete page runs in one transaction; the action is made to): a deployment placed meanwhile
is either committed first and shown as protecting the rows, or waits and finds them gone.
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.actions import delete_selected
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse

from core.ascii_forms import AsciiDigitsAdmin


class LockedDeleteAdmin(AsciiDigitsAdmin, admin.ModelAdmin):
    def lock_for_delete(self, pks: list[Any]) -> None:
        """Lock these rows as the model's own delete does, until the transaction ends."""
        raise NotImplementedError

    def get_actions(self, request: HttpRequest) -> Any:
        actions = super().get_actions(request)
        found = actions.get("delete_selected")
        if found is not None:
            actions["delete_selected"] = (cast(Any, _delete_selected_atomically), found[1], found[2])
        return actions

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        if request.method == "POST" and request.POST.get("post"):  # the confirmed delete
            self.lock_for_delete([obj.pk for obj in objs])
        return super().get_deleted_objects(objs, request)


def _delete_selected_atomically(
    modeladmin: LockedDeleteAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> HttpResponse | None:
    """Django's "Delete selected" in one transaction: the locks taken to look for what protects
    the rows are held until they are deleted."""
    with transaction.atomic():
        response: HttpResponse | None = delete_selected(modeladmin, request, queryset)
        return response
