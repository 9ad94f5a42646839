"""Print a new operator API token for a user (for scripts and curl)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from accounts.services import issue_api_token


class Command(BaseCommand):
    help = "Issue an API token for USERNAME and print it (the only time it is shown)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="cli")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            user = get_user_model().objects.get(username=options["username"])
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user named {options['username']!r}") from None
        self.stdout.write(issue_api_token(user, options["name"]).plaintext)
