"""Forget failed sign-ins (accounts/login_limits.py): of a username, from an address, or all."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from accounts import login_limits


class Command(BaseCommand):
    help = (
        "Forget failed sign-ins: --username U (its own count and its counts from every address), "
        "--address A (its own count and its counts for every username), or --all."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--username", help="a username (any spelling)")
        parser.add_argument("--address", help="a client IP address")
        parser.add_argument("--all", action="store_true", help="every count")

    def handle(self, *args: Any, **options: Any) -> None:
        username: str | None = options["username"]
        address: str | None = options["address"]
        if options["all"] and (username is not None or address is not None):
            raise CommandError("--all clears every count: give it without --username or --address")
        if not options["all"] and username is None and address is None:
            raise CommandError("give --username USERNAME, --address ADDRESS or --all")
        if username is not None:
            if not username.strip():
                raise CommandError(f"--username {username!r} is blank")
            username = username.strip()  # as the sign-in form and the token endpoint read it
        if address is not None:
            try:
                address = login_limits.normalized_address(address)
            except ValueError:
                raise CommandError(f"--address {address!r} is not an IP address") from None

        if "locmem" in settings.CACHES["default"]["BACKEND"]:
            self.stderr.write(
                "The cache is this process's own memory (no REDIS_URL): a running server counts in its"
                " own, which this does not reach; restart it to forget its counts."
            )
        if options["all"]:
            login_limits.clear_all()
            self.stdout.write("Cleared every failed sign-in count.")
        if username is not None:
            login_limits.clear_username(username)
            self.stdout.write(f"Cleared the failed sign-ins of username {username!r}, from every address.")
        if address is not None:
            login_limits.clear_address(address)
            self.stdout.write(f"Cleared the failed sign-ins from address {address}, for every username.")
