"""Create the first admin user with a generated password, once (used by `make run`)."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db.models import Q

from accounts.models import Role


class Command(BaseCommand):
    help = "Create an admin user with a random password if no admin exists; print the password once."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--username", default="admin")

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model().objects
        if users.filter(Q(role=Role.ADMIN) | Q(is_superuser=True), is_active=True).exists():
            self.stdout.write("An admin user exists; not creating another.")
            return
        password = secrets.token_urlsafe(12)
        users.create_user(
            username=options["username"],
            password=password,
            role=Role.ADMIN,
            is_staff=True,
            is_superuser=True,
        )
        self.stdout.write(
            self.style.SUCCESS(
                f"Created admin user {options['username']!r} with password: {password}\n"
                "(shown only now; change it at /admin/password_change/)"
            )
        )
