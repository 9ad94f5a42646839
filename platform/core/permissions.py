"""Role-based API permissions: viewers read, admins write."""

from __future__ import annotations

from typing import Any

from accounts.roles import is_admin, role_of
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request


class RolePermission(BasePermission):
    """Authenticated users with a role may read; only admins may write.

    Unauthenticated requests are refused here too, and DRF turns that into 401 because the first
    authentication class sends a ``WWW-Authenticate`` header.
    """

    message = "Your role does not allow this action; writes need the admin role."

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated and role_of(user) is not None):
            return False
        return request.method in SAFE_METHODS or is_admin(user)


class HasRole(BasePermission):
    """Any authenticated user with a role, for any method (resources a user owns, like API keys)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and role_of(user) is not None)
