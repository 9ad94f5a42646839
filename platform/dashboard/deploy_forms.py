"""The model page's Deploy form, validated by the deployments API's own serializer.

The form names a host and the indices of its GPUs (``0,1``), as an operator reads them on the host;
the API takes device ids. The indices are turned into the ids of that host's devices, and the
serializer (whose ``create`` calls ``deployments.services.create_deployment``) does the rest, so that
the placement rules (tensor-parallel size, devices in use, devices of another host) are the API's.
"""

from __future__ import annotations

from typing import Any

from deployments.api.serializers import DeploymentSerializer
from django.http import QueryDict
from inventory.models import Device, Host, HostStatus
from registry.models import ServedModel

from core import ids
from dashboard.forms import Errors, field_errors, shown

DEPLOY_FIELDS = ("host", "gpus")
# The API's field -> the form's input it is shown beside.
_SHOWN_AT = {"devices": "gpus"}
# The largest index a device may have (Device.index is a PositiveSmallIntegerField): a larger one
# names no GPU, and SQLite cannot compare with one past 64 bits (OverflowError: a 500).
_MAX_INDEX = 32767
_MAX_DIGITS = 100  # a longer number is no index (its digits are not read: int() stops at 4300)


def deploy_context(values: dict[str, str] | None = None, errors: Errors | None = None) -> dict[str, Any]:
    """What the model page's Deploy form shows: every host (online ones first, the others marked
    with their status), the values posted and the errors per input."""
    hosts = sorted(Host.objects.order_by("name"), key=lambda h: h.status != HostStatus.ONLINE)
    choices = [
        {"name": h.name, "label": h.name if h.status == HostStatus.ONLINE else f"{h.name} ({h.status})"}
        for h in hosts
    ]
    return {"deploy_hosts": choices, "deploy_values": values or {}, "deploy_errors": errors or {}}


def _indices(text: str) -> list[int]:
    """``"0, 1"`` -> ``[0, 1]``; ValueError naming the entry that is not an index."""
    out = []
    for part in text.replace(",", " ").split():
        # ASCII digits only (core.ids): isdigit() takes "²", which int() refuses, and isdecimal()
        # other scripts' digits ("٣"); int() refuses more than 4300 digits.
        if not ids.is_digits(part) or len(part) > _MAX_DIGITS:
            raise ValueError(f"Not a GPU index: {shown(part, 20)} (list indices such as 0,1).")
        out.append(int(part))
    return out


def deploy_serializer(post: QueryDict, model: ServedModel) -> tuple[DeploymentSerializer | None, Errors]:
    """A validated serializer creating a deployment of ``model`` from the form's post, and the field
    errors keyed by the form's inputs. None when the GPUs could not be turned into devices."""
    host_name, gpus = post.get("host", "").strip(), post.get("gpus", "").strip()
    # A name holding NUL names no host, and PostgreSQL refuses to compare text with it (a 500).
    host = None if "\x00" in host_name else Host.objects.filter(name=host_name).first()
    errors: Errors = {}
    if host is None:
        errors["host"] = ["Choose a host." if not host_name else f"No host named {shown(host_name)}."]
    try:
        indices = _indices(gpus)
    except ValueError as exc:
        return None, {**errors, "gpus": [str(exc)]}
    if not indices:
        return None, {**errors, "gpus": ["List the GPU indices to deploy on (such as 0,1)."]}
    if host is None:
        return None, errors
    known = [i for i in indices if i <= _MAX_INDEX]
    by_index = dict(Device.objects.filter(host=host, index__in=known).values_list("index", "pk"))
    missing = sorted({i for i in indices if i not in by_index})
    if missing:
        named = ", ".join(map(str, missing))
        return None, {"gpus": [f"Host {host.name} has no GPU {named}."]}
    data = {"model": model.name, "host": host.name, "devices": [by_index[i] for i in indices]}
    serializer = DeploymentSerializer(data=data)
    serializer.is_valid()
    return serializer, shown_errors(serializer.errors)


def shown_errors(errors: Any) -> Errors:
    """The API's field errors keyed by the inputs that show them."""
    return {_SHOWN_AT.get(name, name): messages for name, messages in field_errors(errors).items()}
