from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from accounts.models import ApiKey, ApiToken, User
from core.secret_admin import IssuedSecretAdmin


@admin.register(User)
class PlatformUserAdmin(UserAdmin):
    fieldsets = (*(UserAdmin.fieldsets or ()), ("Platform", {"fields": ("role",)}))
    list_display = ("username", "email", "role", "is_active", "is_superuser")


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
