"""A 409 for a row that protected rows still refer to names a few of them, not thousands.

The API's exception handler (core.api.errors) turns Django's ProtectedError into the 409; the error
here is the one Django raises when a host that deployments still run on is deleted.
"""

from __future__ import annotations

from typing import Any

import pytest
from deployments.models import Deployment
from django.db.models import ProtectedError
from inventory.models import Host
from registry.models import ServedModel

from core.api.errors import exception_handler

pytestmark = pytest.mark.django_db


def _conflict_deleting_a_host_with(deployments: int, model_payload: dict[str, Any]) -> tuple[str, list[int]]:
    """The 409's detail for deleting a host that ``deployments`` deployments use, and their ids."""
    model = ServedModel.objects.create(**model_payload)
    host = Host.objects.create(name="host-a")
    Deployment.objects.bulk_create(Deployment(model=model, host=host) for _ in range(deployments))
    with pytest.raises(ProtectedError) as raised:
        host.delete()
    response = exception_handler(raised.value, {})
    assert response is not None and response.status_code == 409
    return str(response.data["detail"]), sorted(Deployment.objects.values_list("pk", flat=True))


def test_a_409_names_the_first_ten_protected_rows_and_counts_the_rest(model_payload: dict[str, Any]) -> None:
    detail, ids = _conflict_deleting_a_host_with(2500, model_payload)

    listed = detail.split("deployments ", 1)[1].split(" and ", 1)[0].split(", ")
    assert listed == [str(pk) for pk in ids[:10]]
    assert detail.endswith(" and 2490 more. Delete those first.")
    assert len(detail) < 200


def test_a_409_names_every_row_when_there_are_few(model_payload: dict[str, Any]) -> None:
    detail, ids = _conflict_deleting_a_host_with(10, model_payload)

    assert (
        detail
        == f"Cannot delete: still referred to by deployments {', '.join(map(str, ids))}. Delete those first."
    )
