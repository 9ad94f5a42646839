from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from accounts.models import ApiKey, ApiToken, User, lock_users
from core.ascii_forms import AsciiDigitsAdmin
from core.secret_admin import IssuedSecretAdmin


@admin.register(User)
class PlatformUserAdmin(AsciiDigitsAdmin, UserAdmin):
    fieldsets = (*(UserAdmin.fieldsets or ()), ("Platform", {"fields": ("role",)}))
    list_display = ("username", "email", "role", "is_active", "is_superuser")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """The bulk delete locks the users' rows first, as ``User.delete`` does."""
        with transaction.atomic():
            lock_users(queryset.values_list("pk", flat=True))
            super().delete_queryset(request, queryset)


# Django's own admin of groups, with the ASCII-only inputs of the others (its permissions).
admin.site.unregister(Group)


@admin.register(Group)
class PlatformGroupAdmin(AsciiDigitsAdmin, GroupAdmin):
    pass


@admin.register(ApiToken)
class ApiTokenAdmin(IssuedSecretAdmin):
    holder_field = "user"
    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "revoked")
    readonly_fields = ("prefix", "digest", "created_at", "last_used_at")


@admin.register(ApiKey)
class ApiKeyAdmin(IssuedSecretAdmin):
    holder_field = "owner"
    list_display = ("name", "owner", "prefix", "requests_per_minute", "tokens_per_day", "revoked")
    readonly_fields = ("prefix", "digest", "created_at", "last_used_at")
