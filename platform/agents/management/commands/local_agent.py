"""Prepare a host for a local agent and print its (new) token: used by `make run`.

    manage.py local_agent NAME [--simulated] [--tiny-model DIR]

Creates or updates host NAME (address 127.0.0.1) and rotates its agent token (earlier tokens are
revoked), printing the new one alone on stdout. With ``--tiny-model DIR`` it also prepares the
served model ``tiny-llama`` (source DIR, vLLM's CPU build, the Aqua scheduler and KV connector) and
its deployment on the host's device 0 (`prepare_tiny_model`). The device row is created ahead of
the agent's first `register` (which then updates it with what the agent reports), so the deployment
exists when the agent first asks for its desired list.

Safe to run again: an operator's changes stand. The model is seeded once per host and then known
by its row (`DemoModelSeed`), not its name: renamed, it is still the one kept current; deleted, it
is not seeded again. Its settings are the defaults below only when it is created; a deployment of
it on the host, running or stopped, is left as it is; and when the device is taken by another
deployment the model stays undeployed. What was not started, and why, is one line on stderr.
"""

from __future__ import annotations

import json
import os
from typing import Any

from deployments.models import Deployment, DesiredState
from deployments.services import PlacementError, create_deployment
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from inventory.models import Device, DeviceKind, Host
from inventory.services import issue_agent_token, register_host
from inventory.validators import host_name_error
from registry.models import ServedModel
from registry.services import update_served_model

from agents.models import DemoModelSeed

TINY_MODEL = "tiny-llama"
# vLLM CPU engine options for the tiny model: 1 GiB KV cache, a fixed seed, no torch.compile warm-up
# (minutes on a busy 2-core machine, for a model this small), and Aqua's scheduler and KV connector
# (gpu_agent/engines/command.py turns "aqua" into --scheduler-cls and --kv-transfer-config).
TINY_OPTIONS = {"cpu_kvcache_space_gib": 1, "seed": 0, "enforce_eager": True, "aqua": True}
# The tiny model's settings when `prepare_tiny_model` creates it (its source aside).
TINY_DEFAULTS: dict[str, Any] = {
    "dtype": "float32",
    "tensor_parallel_size": 1,
    "max_context_length": 256,
    "slo_ttft_p99_ms": 2000.0,
    "slo_tbt_p99_ms": 500.0,
    "engine_options": TINY_OPTIONS,
}


class Command(BaseCommand):
    help = "Create/update a local agent's host, rotate and print its token; optionally deploy the tiny model."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name")
        parser.add_argument("--simulated", action="store_true", help="a simulated host (--simulate agents)")
        parser.add_argument("--tiny-model", help="directory of the built tiny model to deploy on device 0")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        if error := host_name_error(name):
            raise CommandError(error)
        tiny = options["tiny_model"]
        if tiny is not None and not os.path.isdir(tiny):
            raise CommandError(f"--tiny-model {tiny!r} is not a directory")
        if tiny is not None:
            tiny = os.path.abspath(tiny)  # stored as the model's source, which has a length limit
            limit = ServedModel._meta.get_field("source").max_length
            if limit is not None and len(tiny) > limit:
                raise CommandError(
                    f"--tiny-model {tiny[:40]!r}... ({len(tiny)} characters as an absolute path) is longer"
                    f" than the limit of {limit} characters of a model's source"
                )
        notice = ""
        with transaction.atomic():
            host = register_host(name, "127.0.0.1", simulated=options["simulated"])
            if tiny is not None:
                _, notice = prepare_tiny_model(host, tiny)
            token = issue_agent_token(host).plaintext
        if notice:
            # stderr: stdout is the token alone (`make run` passes it to the agent).
            self.stderr.write(notice, style_func=self.style.WARNING)
        self.stdout.write(token)


def prepare_tiny_model(host: Host, source: str) -> tuple[Deployment | None, str]:
    """The tiny model registered (from ``source``) and its deployment on ``host``'s device 0.

    The model is the one seeded for ``host`` before (`demo_model`): it keeps its settings, name
    included, but for its source, kept at ``source`` (the bundled model's current path) through
    `registry.services.update_served_model`, which has the agent restart a running engine. One the
    operator deleted is not seeded again: then nothing is prepared, and nothing said.

    Its deployment on ``host`` is created, meant to run, only if the host has none (running or
    stopped: an operator who stopped it keeps it stopped) and the device is free.

    Returns:
        The host's deployment of the model (``None`` if it could not be placed) and, when it is not
        meant to run, a line for the operator saying why and how to start it; else "".
    """
    model = demo_model(host, source)
    if model is None:
        return None, ""
    if model.source != source:
        model = update_served_model(model, {"source": source})
    device, _ = Device.objects.get_or_create(
        host=host,
        index=0,
        defaults={
            "uuid": f"cpu-{host.name}",
            "name": "CPU",
            "kind": DeviceKind.CPU,
            "memory_total_bytes": 0,  # the agent's register fills in the real figure
        },
    )
    deployments = Deployment.objects.filter(model=model, host=host)
    running = deployments.filter(desired_state=DesiredState.RUNNING).order_by("pk").first()
    if running is not None:
        return running, ""
    stopped = deployments.order_by("-pk").first()
    if stopped is not None:
        return stopped, (
            f"{stopped} (deployment {stopped.pk}) is stopped and stays so; to start it: "
            f"PATCH /api/v1/deployments/{stopped.pk}/ {json.dumps({'desired_state': 'running'})}"
        )
    try:
        return create_deployment(model, host, [device]), ""
    except PlacementError as error:
        body = json.dumps({"model": model.name, "host": host.name, "devices": [device.pk]})
        return None, (
            f"{model.name} is registered but not deployed on {host.name}: {error} "
            f"To deploy it once the device is free: POST /api/v1/deployments/ {body}"
        )


def demo_model(host: Host, source: str) -> ServedModel | None:
    """The demo model seeded for ``host`` (a `DemoModelSeed`), seeded now on its first run with
    ``--tiny-model``; ``None`` once the operator deleted it.

    A first run adopts a model named `TINY_MODEL`, else one of ``source`` (seeded before the
    seed was remembered, maybe renamed since), and creates one with `TINY_DEFAULTS` only when
    there is neither."""
    seed = DemoModelSeed.objects.select_related("model").filter(host=host).first()
    if seed is not None:
        return seed.model
    model = (
        ServedModel.objects.filter(name=TINY_MODEL).first()
        or ServedModel.objects.filter(source=source).order_by("pk").first()
        or ServedModel.objects.create(name=TINY_MODEL, source=source, **TINY_DEFAULTS)
    )
    DemoModelSeed.objects.create(host=host, model=model)
    return model
