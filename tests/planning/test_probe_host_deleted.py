"""A probe whose host is deleted while it waits for the answer (its deployment stopped and deleted,
then the host: its probe requests go with it) fails as a profiling error naming the host, the job's
error an operator can act on; it raised ProbeRequest.DoesNotExist, and the job failed as a bug, with
a traceback."""

from __future__ import annotations

import pytest
from agents.models import AgentLink
from deployments.models import Deployment, ObservedState
from inventory.models import Host, HostStatus
from planning.engine_probe import AgentEngineProbe
from planning.models import ProbeRequest

from serving.profiler import ProfilingError, WorkloadSpec
from tests.planning.helpers import make_model

pytestmark = pytest.mark.django_db


def test_a_probe_whose_host_is_deleted_meanwhile_fails_naming_the_host() -> None:
    host = Host.objects.create(name="gpu-a", address="127.0.0.1", status=HostStatus.ONLINE)
    AgentLink.objects.create(host=host, connected=True)
    deployment = Deployment.objects.create(
        model=make_model("tiny"), host=host, observed_state=ObservedState.RUNNING
    )
    deployment = Deployment.objects.select_related("host", "model").get(pk=deployment.pk)

    def host_deleted() -> bool:  # polled while the probe waits: the operator deletes the host now
        if Host.objects.filter(pk=host.pk).exists():
            Deployment.objects.filter(pk=deployment.pk).delete()
            Host.objects.filter(pk=host.pk).delete()
        return False

    probe = AgentEngineProbe(
        deployment, WorkloadSpec(num_requests=12, seed=5, max_context=512), should_cancel=host_deleted,
        poll_s=0.01, timeout_s=300,
    )  # fmt: skip
    with pytest.raises(ProfilingError, match="'gpu-a' was deleted"):
        probe.measure(1.0)
    assert not ProbeRequest.objects.exists()
