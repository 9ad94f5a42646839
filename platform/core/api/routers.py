"""The API's router: DRF's SimpleRouter, whose numeric lookups take ASCII digits only.

DRF's lookup pattern takes any text up to the next slash or dot, and the database field reads it
with ``int()``, which takes any Unicode decimal digit and surrounding spaces: ``/api/v1/models/%EF%BC%92/``
(a full-width 2) and ``/api/v1/models/%202/`` answered model 2. A primary key (``pk``, ``id``, or a
related row's, ``job__pk``) now matches ``[0-9]+`` only; anything else is the API's JSON 404.

Other lookups (a model's name) take DRF's pattern less NUL: PostgreSQL text cannot hold NUL, and
looking such a name up raised an error there (a 500) rather than find nothing.
"""

from __future__ import annotations

from typing import Any

from rest_framework.routers import SimpleRouter  # noqa: TID251


def numeric_lookup(field: str) -> bool:
    """Whether a viewset's ``lookup_field`` is a primary key (its own or a related row's)."""
    return field in ("pk", "id") or field.endswith(("__pk", "__id"))


class Router(SimpleRouter):
    def get_lookup_regex(self, viewset: Any, lookup_prefix: str = "") -> str:
        if getattr(viewset, "lookup_value_regex", None) is not None:  # the viewset's own
            return super().get_lookup_regex(viewset, lookup_prefix)
        field = getattr(viewset, "lookup_field", "pk")
        kwarg = getattr(viewset, "lookup_url_kwarg", None) or field
        value = "[0-9]+" if numeric_lookup(field) else "[^/.\\x00]+"
        return f"(?P<{lookup_prefix}{kwarg}>{value})"
