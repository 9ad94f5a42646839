from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin
from django.http import HttpRequest

from accounts.models import ApiKey, ApiToken, User


@admin.register(User)
class PlatformUserAdmin(UserAdmin):
    fieldsets = (*(UserAdmin.fieldsets or ()), ("Platform", {"fields": ("role",)}))
    list_display = ("username", "email", "role", "is_active", "is_superuser")


class IssuedSecretAdmin(admin.ModelAdmin):
    """Tokens and keys are issued by the API and the dashboard, which show the secret once and
    store its digest; an admin form cannot, so the admin lists, edits and revokes but never adds."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(IssuedSecretAdmin):
    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "revoked")
    readonly_fields = ("prefix", "digest", "created_at", "last_used_at")


@admin.register(ApiKey)
class ApiKeyAdmin(IssuedSecretAdmin):
    list_display = ("name", "owner", "prefix", "requests_per_minute", "tokens_per_day", "revoked")
    readonly_fields = ("prefix", "digest", "created_at", "last_used_at")
