"""Each deployment's spec carries its engine key, the one the gateway sends to its replica.

The agent starts the engine with the spec's key (vLLM refuses /v1 requests without it), so the key
in the desired list and the key the gateway relays with must be the same, and differ between
deployments: one engine's key must not open another's.
"""

from __future__ import annotations

import time

import pytest
from agents import services
from deployments.engine_keys import engine_api_key
from gateway.services import healthy_targets
from registry.models import ServedModel

from gpu_agent.protocol import DesiredDeployments, dumps, loads

from .conftest import AgentHost
from .test_reconcile_audit import deploy, register, status

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_desired_list_carries_each_deployments_engine_key_as_the_gateway_uses_it(
    agent_host: AgentHost, served_model: ServedModel
) -> None:
    host = agent_host.host
    linked = register(host)
    first, second = deploy(served_model, host, 0), deploy(served_model, host, 1)

    # What the agent receives over the wire (the key is in the frame, not only in the object).
    desired = loads(dumps(services.desired_deployments(linked)), sender="control_plane")
    assert isinstance(desired, DesiredDeployments)
    keys = {spec.id: spec.api_key for spec in desired.deployments}
    assert keys == {str(first.pk): engine_api_key(first.pk), str(second.pk): engine_api_key(second.pk)}
    assert len(set(keys.values())) == 2 and all(len(k) == 64 for k in keys.values())
    assert all(k not in repr(desired) for k in keys.values()), "a logged spec shows no key"

    now = time.time()
    services.report_status(linked, status(first, "running", now, port=8100))
    services.report_status(linked, status(second, "running", now, port=8101))
    targets = {t.deployment_id: t.api_key for t in healthy_targets(served_model)}
    assert targets == {first.pk: keys[str(first.pk)], second.pk: keys[str(second.pk)]}
