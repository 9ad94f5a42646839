"""Register a host and print a fresh agent token for it (shown once)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from gpu_agent.address import host_address
from inventory.services import issue_agent_token, register_host
from inventory.validators import host_address_error, host_name_error


class Command(BaseCommand):
    help = (
        "Create or update HOST and print a new agent token for it; earlier tokens are revoked. An"
        " existing host keeps its address and simulated flag unless --address or --simulated is given."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name")
        parser.add_argument(
            "--address",
            help="host name or IP address (no port) the gateway reaches its engines on; the agent's"
            " --address replaces it when the agent registers",
        )
        # None when left out: an existing host keeps its flag (its agent reports it at every register).
        parser.add_argument("--simulated", action="store_true", default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        name, address = options["name"], options["address"]
        if error := host_name_error(name):
            raise CommandError(error)
        if address is not None and (error := host_address_error(address)):
            raise CommandError(f"--address {error}")
        if address is not None:
            address = host_address(address)  # "[::1]" -> "::1", as agents send
        with transaction.atomic():  # no host without its token
            host = register_host(name, address, simulated=options["simulated"])
            token = issue_agent_token(host).plaintext
        self.stdout.write(token)
