"""The admin of issued secrets (operator API tokens, end-user API keys, agent tokens)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from core.ascii_forms import AsciiDigitsAdmin


class IssuedSecretAdmin(AsciiDigitsAdmin, admin.ModelAdmin):
    """Tokens and keys are issued by the API and the dashboard, which show the secret once and
    store its digest; an admin form cannot, so the admin lists, edits and revokes but never adds.

    A secret's holder never changes: handing a token to another user would let whoever may edit
    tokens act as that user (a staff viewer as a superuser), a key's usage and quotas belong to
    its owner, and an agent token moved to another host would let its holder speak for that host.
    Revoking is for good: a revoked secret cannot be made live again here (a live key would also
    escape API_KEYS_PER_USER, the playground's retired keys would return, and a host would have
    two live agent tokens).
    """

    holder_field = ""

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        fields = list(super().get_readonly_fields(request, obj))
        if obj is not None:
            fields.append(self.holder_field)
            if obj.revoked:
                fields.append("revoked")
        return fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
