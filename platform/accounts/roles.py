"""What a user may do: the two platform roles."""

from __future__ import annotations

from typing import Any

from accounts.models import Role


def role_of(user: Any) -> Role | None:
    """The user's role, or ``None`` for anonymous or inactive users. Superusers are admins."""
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    if user.is_superuser:
        return Role.ADMIN
    return Role(user.role)


def is_admin(user: Any) -> bool:
    """True when the user may change platform state."""
    return role_of(user) == Role.ADMIN
