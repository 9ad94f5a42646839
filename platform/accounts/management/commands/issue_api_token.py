"""Print a new operator API token for a user (for scripts and curl)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from accounts.models import ApiToken
from accounts.services import issue_api_token
from core.validators import no_control_characters


class Command(BaseCommand):
    help = "Issue an API token for USERNAME and print it (the only time it is shown)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="cli")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        limit = ApiToken._meta.get_field("name").max_length
        if not name.strip():
            raise CommandError(f"--name {name!r} is blank")
        # PostgreSQL text cannot hold NUL: storing the name, or looking the username up, raised
        # DataError (a traceback). The API refuses NUL in both too (DRF's CharField).
        if "\x00" in name:
            raise CommandError(f"--name {name!r} holds a NUL character")
        try:  # the rule of the model field, which the API's serializer applies too
            no_control_characters(name)
        except ValidationError as exc:
            raise CommandError(f"--name {name!r}: {exc.messages[0]}") from None
        if "\x00" in options["username"]:
            raise CommandError(f"username {options['username']!r} holds a NUL character; no user's name does")
        if limit is not None and len(name) > limit:
            cut = f"{name[:40]!r}... ({len(name)} characters)"
            raise CommandError(f"--name {cut} is longer than the limit of {limit} characters")
        try:
            user = get_user_model().objects.get(username=options["username"])
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user named {options['username']!r}") from None
        self.stdout.write(issue_api_token(user, name).plaintext)
