"""`node.mode` through NRI: on a cluster node a Kubernetes pod gets devices only from its signed
assignment; a standalone host keeps the local `hcs.io/*` path."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hcsd.discovery import Inventory
from hcsd.model import NodeMode
from hcsd.refusals import Reason
from hcsd.runtime.nri.ttrpc import Code, TtrpcError
from hcsd.runtime.nri.v1alpha1 import api_pb2 as api
from tests.nri.test_plugin import Setup, assignment, container_request, plugin_setup


@pytest.fixture
async def cluster(tmp_path: Path, mixed_inventory: Inventory) -> AsyncIterator[Setup]:
    async with plugin_setup(tmp_path, mixed_inventory, mode=NodeMode.CLUSTER) as setup:
        yield setup


async def create(setup: Setup, request: api.ContainerRequest) -> api.CreateContainerResponse:
    return await setup.peer.call("CreateContainer", request, api.CreateContainerResponse)


@pytest.mark.parametrize(
    ("annotations", "pod_annotations", "named"),
    [
        pytest.param({"hcs.io/devices": "2"}, {}, "hcs.io/devices", id="devices"),
        pytest.param({}, {"hcs.io/vram": "8Gi"}, "hcs.io/vram", id="pod-vram"),
        pytest.param({"hcs.io/tflops-fp16": "x"}, {}, "hcs.io/tflops-fp16", id="malformed"),
    ],
)
async def test_a_pod_without_an_assignment_gets_nothing_on_a_cluster_node(
    cluster: Setup, annotations: dict[str, str], pod_annotations: dict[str, str], named: str
) -> None:
    """The issue's case: a pod with no assignment and `hcs.io/devices: "2"` took both A100s,
    uncharged by the scheduler and its ComputeQuota."""
    request = container_request("c1", annotations=annotations, pod_annotations=pod_annotations)
    with pytest.raises(TtrpcError) as refused:
        await create(cluster, request)
    assert refused.value.code == Code.PERMISSION_DENIED
    message = refused.value.message
    assert message.startswith(f"hcsd: team-a/trainer/main: asks for devices with {named} but")
    assert 'node.mode = "cluster"' in message and "hcs.io/assignment" in message
    assert message.endswith("(refused: no_assignment)")
    assert cluster.service.allocations()[0].container_id == "gone-container"  # nothing new
    assert cluster.service.refusal_counts() == {Reason.NO_ASSIGNMENT: 1}
    assert not (cluster.run_dir / "containers" / "c1").exists()


async def test_a_cluster_node_serves_assignments_plain_pods_and_containers_outside_pods(
    cluster: Setup,
) -> None:
    await create(
        cluster, container_request("c1", pod_annotations={"hcs.io/assignment": assignment()})
    )
    held = cluster.service.allocation("c1")
    assert held is not None and held.source == "assignment"
    # A pod that asks for nothing is not refused.
    assert await create(cluster, container_request("c2")) == api.CreateContainerResponse()
    # No pod uid (nerdctl, ctr): not a Kubernetes pod, the local path stays.
    reply = await create(
        cluster, container_request("c3", annotations={"hcs.io/vram": "1Gi"}, uid="")
    )
    assert reply.adjust.linux.devices
    held = cluster.service.allocation("c3")
    assert held is not None and held.source == "local"


async def test_a_standalone_node_keeps_the_local_path_for_pods(nri: Setup) -> None:
    reply = await create(nri, container_request("c1", annotations={"hcs.io/devices": "2"}))
    assert len({d.path for d in reply.adjust.linux.devices if d.path[-1].isdigit()}) >= 2
    held = nri.service.allocation("c1")
    assert held is not None and held.source == "local" and len(held.grants) == 2
