"""Register a host and print a fresh agent token for it (shown once)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils.text import slugify

from inventory.services import issue_agent_token, register_host


class Command(BaseCommand):
    help = "Create or update HOST and print a new agent token for it; earlier tokens are revoked."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name")
        parser.add_argument("--address", default="")
        parser.add_argument("--simulated", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        if slugify(name) != name:
            raise CommandError(f"host name {name!r} must be a slug (letters, digits, '-', '_')")
        host = register_host(name, options["address"], simulated=options["simulated"])
        self.stdout.write(issue_agent_token(host).plaintext)
