"""Create the first admin user with a generated password, once (used by `make run`)."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q

from accounts.models import Role


class Command(BaseCommand):
    help = "Create an admin user with a random password if no admin exists; print the password once."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--username", default="admin")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"]
        model = get_user_model()
        check_username(model, username)
        users = model.objects
        if users.filter(Q(role=Role.ADMIN) | Q(is_superuser=True), is_active=True).exists():
            self.stdout.write("An admin user exists; not creating another.")
            return
        if users.filter(**{model.USERNAME_FIELD: username}).exists():
            raise CommandError(
                f"a user named {username!r} exists and is not an active admin; give another --username"
            )
        password = secrets.token_urlsafe(12)
        users.create_user(
            username=username,
            password=password,
            role=Role.ADMIN,
            is_staff=True,
            is_superuser=True,
        )
        self.stdout.write(
            self.style.SUCCESS(
                f"Created admin user {username!r} with password: {password}\n"
                "(shown only now; change it at /accounts/password_change/)"
            )
        )


def check_username(model: Any, username: str) -> None:
    """CommandError naming ``--username`` unless the user model's username field takes it."""
    field = model._meta.get_field(model.USERNAME_FIELD)
    if not username:
        raise CommandError("--username '' is empty")
    if field.max_length is not None and len(username) > field.max_length:
        cut = f"{username[:40]!r}... ({len(username)} characters)"
        raise CommandError(f"--username {cut} is longer than the limit of {field.max_length} characters")
    try:
        field.run_validators(username)
    except ValidationError as exc:
        raise CommandError(f"--username {username!r}: {' '.join(exc.messages)}") from None
