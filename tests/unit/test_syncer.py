"""hcs-syncer between hcsd's real API (in this process, on the simulated mixed node) and a
small object server (objectserver.py) that can refuse requests on purpose: an outage is
retried and followed by a read-back that writes only what differs, a Lease someone else
wrote is read again, a ComputeNode someone deleted comes back at the resync.
tests/cluster/test_syncer.py runs the syncer against a real kube-apiserver."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hcsd.api.server import ApiServer
from hcsd.cluster.syncer import Syncer, SyncerSettings
from hcsd.discovery import Inventory
from hcsd.model import Request
from hcsd.service import NodeService
from tests.conftest import GiB
from tests.harness.local import local_node
from tests.harness.waiting import eventually
from tests.unit.objectserver import ObjectServer

NODE = "/apis/hcs.io/v1alpha1/computenodes/n1"
LEASE = "/apis/coordination.k8s.io/v1/namespaces/hcs-system/leases/hcs-node-n1"


@dataclass
class Hcsd:
    socket: str
    service: NodeService


@pytest.fixture
async def hcsd(tmp_path: Path, mixed_inventory: Inventory) -> AsyncIterator[Hcsd]:
    node = local_node(tmp_path, mixed_inventory)
    socket = str(tmp_path / "hcsd.sock")
    server = ApiServer(node.service, socket)
    await server.start()
    yield Hcsd(socket, node.service)
    await server.stop(0.5)
    node.close()


@pytest.fixture
def server() -> Iterator[ObjectServer]:
    running = ObjectServer()
    yield running
    running.close()


@pytest.fixture
def start(hcsd: Hcsd, server: ObjectServer) -> Iterator[Any]:
    started: list[Syncer] = []

    def starting(**settings: Any) -> Syncer:
        options = {"lease_seconds": 2, "renew": 0.1, "settle": 0.05, "resync": 300.0, **settings}
        syncer = Syncer(SyncerSettings("n1", hcsd.socket, **options), server.kube())
        threading.Thread(target=syncer.run, daemon=True).start()
        started.append(syncer)
        return syncer

    yield starting
    for syncer in started:
        syncer.stop()


def status(server: ObjectServer) -> dict[str, Any]:
    found = server.get(NODE)
    return (found or {}).get("status") or {}


async def test_the_first_pass_creates_the_compute_node_and_the_lease(
    start: Any, server: ObjectServer
) -> None:
    syncer = start()
    await eventually(syncer.synced.is_set, "the first pass", timeout=10)
    node = server.get(NODE)
    assert node is not None and node["spec"]["nodeName"] == "n1"
    assert status(server)["deviceCount"] == 6
    await eventually(lambda: server.get(LEASE) is not None, "the first heartbeat", timeout=5)
    assert (syncer.writes["create"], syncer.writes["status"], syncer.writes["spec"]) == (1, 1, 0)


async def test_an_outage_is_retried_then_read_back_and_only_the_change_written(
    start: Any, server: ObjectServer, hcsd: Hcsd, caplog: pytest.LogCaptureFixture
) -> None:
    syncer = start()
    await eventually(syncer.synced.is_set, "the first pass", timeout=10)
    reads = server.count("GET", NODE)
    server.refuse("PUT", 503, NODE)  # the next write: the status with the new allocation
    with caplog.at_level(logging.WARNING, "hcsd.cluster.syncer"):
        hcsd.service.allocate(Request("job-1", vram_bytes=GiB))
        await eventually(lambda: syncer.writes["status"] == 2, "the retried write")
    assert len(status(server)["allocations"]) == 1
    assert server.refused(503) == 1
    assert "sync failed (503 ServiceUnavailable" in caplog.text
    assert server.count("GET", NODE) > reads  # what is there was read again before writing
    assert (syncer.writes["create"], syncer.writes["status"], syncer.writes["spec"]) == (1, 2, 0)


async def test_a_lease_someone_else_wrote_is_read_again_and_renewed(
    start: Any, server: ObjectServer
) -> None:
    syncer = start()
    await eventually(lambda: syncer.writes["lease"] >= 2, "a renewal", timeout=10)
    lease = server.get(LEASE)
    assert lease is not None
    lease["spec"]["holderIdentity"] = "intruder"
    server.store(LEASE, lease)  # a new resourceVersion: the syncer's next replace is stale
    await eventually(lambda: server.refused(409, LEASE) >= 1, "the conflict", timeout=5)
    await eventually(
        lambda: (server.get(LEASE) or {})["spec"]["holderIdentity"] == "n1", "renewed again"
    )


async def test_a_deleted_compute_node_is_created_again_at_the_resync(
    start: Any, server: ObjectServer
) -> None:
    syncer = start(resync=0.3)
    await eventually(syncer.synced.is_set, "the first pass", timeout=10)
    server.delete(NODE)
    await eventually(lambda: syncer.writes["status"] == 2, "the resync", timeout=5)
    assert syncer.writes["create"] == 2 and status(server)["deviceCount"] == 6
