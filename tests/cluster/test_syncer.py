"""hcs-syncer between a real hcsd (the integration harness's, on the simulated mixed node) and
a real kube-apiserver, as the syncer's service account: what it writes, and when."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hcsd.api.client import Client
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.syncer import Syncer, SyncerSettings
from tests.cluster.controlplane import ControlPlane
from tests.fakes.rdma import FakePort, make_rdma
from tests.harness.daemon import Daemon
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.slow

NODES = "/apis/hcs.io/v1alpha1/computenodes/"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/hcs-system/leases/hcs-node-"
GID = "fec0:0000:0000:0001:0002:c903:0031:7a51"


@pytest.fixture
def hcsd(tmp_path: Path) -> Iterator[Daemon]:
    daemon = Daemon(tmp_path)
    daemon.start()
    yield daemon
    daemon.close()


class Running:
    def __init__(self, plane: ControlPlane, hcsd: Daemon, node: str, **settings: Any) -> None:
        self.node = node
        self.admin = plane.kube()
        options = {"lease_seconds": 3, "renew": 0.3, "settle": 0.2, "resync": 300.0, **settings}
        self.syncer = Syncer(
            SyncerSettings(node_name=node, socket_path=hcsd.socket, **options),
            plane.syncer_kube(node),  # its pod's token: admission-syncer.yaml needs the node
        )
        self.thread = threading.Thread(target=self.syncer.run, daemon=True)
        self.thread.start()

    def status(self) -> dict[str, Any]:
        found: dict[str, Any] = self.admin.get(NODES + self.node).get("status") or {}
        return found

    def renewed(self) -> str:
        return str(self.admin.get(LEASES + self.node)["spec"]["renewTime"])

    def stop(self) -> None:
        self.syncer.stop()
        self.thread.join(10)


@pytest.fixture
def start(plane: ControlPlane, hcsd: Daemon) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def starting(node: str, **settings: Any) -> Running:
        started.append(Running(plane, hcsd, node, **settings))
        return started[-1]

    yield starting
    for r in started:
        r.stop()


def test_status_is_written_on_change_only_and_a_burst_is_one_write(
    start: Callable[..., Running], hcsd: Daemon
) -> None:
    running = start("on-change")
    syncer = running.syncer
    assert syncer.synced.wait(15)
    assert running.status()["deviceCount"] == 6 and running.status()["allocations"] == []
    assert (syncer.writes["create"], syncer.writes["status"], syncer.writes["spec"]) == (1, 1, 0)
    leases = syncer.writes["lease"]
    time.sleep(1.5)  # steady state: only the heartbeat is written
    assert syncer.writes["status"] == 1 and syncer.writes["lease"] >= leases + 3
    with Client(hcsd.socket) as client:
        for i in range(12):
            client.allocate(pb.AllocateRequest(container_id=f"burst-{i}", vram="1Gi"))
    wait_for(lambda: len(running.status()["allocations"]) == 12, what="the burst in the status")
    time.sleep(0.6)  # a trailing pass, if any, has run
    # hcsd sent 12 events within the settle window: one write, two if the burst straddled it.
    assert syncer.writes["status"] - 1 in (1, 2), dict(syncer.writes)
    assert syncer.writes["spec"] == 0 and syncer.writes["create"] == 1


def test_a_resync_writes_nothing_unless_someone_else_changed_the_status(
    start: Callable[..., Running],
) -> None:
    running = start("resynced", resync=1.0)
    syncer = running.syncer
    assert syncer.synced.wait(15)
    time.sleep(2.5)  # two resyncs: each reads the object back and finds it current
    assert syncer.writes["status"] == 1
    edited = running.admin.get(NODES + running.node)
    edited["status"]["phase"] = "NotReady"
    running.admin.replace(NODES + running.node + "/status", edited)
    wait_for(lambda: running.status()["phase"] == "Ready", timeout=5, what="the status repaired")
    # counted when the PUT returns, a moment after the API server stored it
    wait_for(lambda: syncer.writes["status"] >= 2, timeout=5, what="the repair counted")
    assert syncer.writes["status"] == 2


def test_the_controllers_fleet_field_survives_the_syncers_writes(
    plane: ControlPlane, start: Callable[..., Running], hcsd: Daemon
) -> None:
    """status.fleet is hcs-controller's: a resync does not rewrite the status because of it,
    and the syncer's next write (after a change in hcsd) keeps it."""
    running = start("fleet-kept", resync=1.0)
    syncer = running.syncer
    assert syncer.synced.wait(15)
    fleet = {"summary": "1 slow: GPU-0", "slowDevices": [{"uuid": "GPU-0", "efficiency": 0.6}]}
    controller = plane.kube("controller")
    controller.patch(NODES + running.node + "/status", {"status": {"fleet": fleet}})
    controller.close()
    time.sleep(2.5)  # two resyncs read it back
    assert syncer.writes["status"] == 1 and running.status()["fleet"] == fleet
    with Client(hcsd.socket) as client:
        client.allocate(pb.AllocateRequest(container_id="after-fleet", vram="1Gi"))
    wait_for(lambda: len(running.status()["allocations"]) == 1, what="the allocation")
    assert running.status()["fleet"] == fleet
    wait_for(lambda: syncer.writes["status"] >= 2, timeout=5, what="the write counted")
    assert syncer.writes["status"] == 2


def test_the_fleet_written_just_before_a_spec_change_survives_it(
    plane: ControlPlane, start: Callable[..., Running], hcsd: Daemon
) -> None:
    """No resync between the controller's status.fleet and the syncer's next pass, which
    writes the spec and then the status: the status PUT carries the fleet the spec PATCH
    answered with."""
    running = start("fleet-spec")
    syncer = running.syncer
    assert syncer.synced.wait(15)
    fleet = {"summary": "1 slow: GPU-1", "slowDevices": [{"uuid": "GPU-1", "efficiency": 0.5}]}
    controller = plane.kube("controller")
    controller.patch(NODES + running.node + "/status", {"status": {"fleet": fleet}})
    controller.close()
    # the syncer's view of its spec is outdated, as after a hot-plug in hcsd: its next pass
    # writes the spec, then the status (a new allocation)
    assert syncer._written is not None
    syncer._written = {**syncer._written, "spec": {**syncer._written["spec"], "devices": []}}
    with Client(hcsd.socket) as client:
        client.allocate(pb.AllocateRequest(container_id="spec-fleet", vram="1Gi"))
    wait_for(lambda: syncer.writes["spec"] == 1 and syncer.writes["status"] == 2,
             what="the spec and status writes")  # fmt: skip
    assert running.status()["fleet"] == fleet


def test_the_heartbeat_follows_hcsd(start: Callable[..., Running], hcsd: Daemon) -> None:
    running = start("heartbeat")
    assert running.syncer.synced.wait(15)
    # "synced" means hcsd's state is mirrored; the Lease's first write may follow a moment later.
    wait_for(lambda: running.syncer.writes["lease"] > 0, what="the first heartbeat")
    first = running.renewed()
    wait_for(lambda: running.renewed() > first, timeout=3, what="a renewal")
    assert hcsd.process is not None
    hcsd.process.kill()
    hcsd.process.wait()
    # The syncer notices (the status read fails) and renewals stop: none over 0.9 s (three
    # renewal periods), waiting up to 10 s for that on a busy machine.
    seen = [running.syncer.writes["lease"]]

    def quiet() -> bool:
        time.sleep(0.9)
        seen.append(running.syncer.writes["lease"])
        return seen[-1] == seen[-2]

    wait_for(quiet, timeout=10, what="renewals to stop")
    stopped, writes = running.renewed(), running.syncer.writes["lease"]
    time.sleep(1.5)  # five renewal periods
    assert running.renewed() == stopped and running.syncer.writes["lease"] == writes
    hcsd.start()  # the same state directory and socket
    wait_for(lambda: running.renewed() > stopped, timeout=10, what="renewals after hcsd's return")


CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/computenodes.hcs.io"


def test_an_older_crd_that_prunes_new_fields_does_not_make_it_rewrite(
    plane: ControlPlane, start: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    """The CRD applied before this syncer's release lacks fields it writes: the API server
    prunes them, so the object read back never equals what was sent. The syncer compares
    with what it sent and what the server kept of it, and says once what was pruned."""
    admin = plane.kube()
    crd = admin.get(CRD)
    original = json.loads(json.dumps(crd))
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    status = schema["properties"]["status"]["properties"]
    del status["acuTotal"], status["acuAllocated"]  # fields added with the cluster view
    admin.replace(CRD, crd)
    try:
        time.sleep(1.0)  # the API server serves the new schema
        with caplog.at_level(logging.WARNING, logger="hcsd.cluster.syncer"):
            running = start("pruned", resync=0.5)
            syncer = running.syncer
            assert syncer.synced.wait(15)
            assert "acuTotal" not in running.status()  # pruned indeed
            time.sleep(3.0)  # six resyncs, each reading the object back
            assert syncer.writes["status"] == 1, dict(syncer.writes)
        pruned = [r.getMessage() for r in caplog.records if "pruned" in r.getMessage()]
        assert len(pruned) == 1 and "status.acuAllocated, status.acuTotal" in pruned[0], pruned
    finally:
        current = admin.get(CRD)
        original["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        admin.replace(CRD, original)


def test_the_fabric_hcsd_discovers_reaches_the_computenode(
    plane: ControlPlane, tmp_path: Path
) -> None:
    """hcsd reads the RDMA ports in its sysfs, the syncer writes them into spec.fabric, and the
    printer column shows the domain."""
    sysfs = make_rdma(tmp_path / "sys", [FakePort("mlx5_0", gid0=GID)])
    daemon = Daemon(tmp_path / "hcsd", settings={"discovery": {"sysfs": sysfs}})
    daemon.start()
    running = Running(plane, daemon, "fabric-node")
    try:
        assert running.syncer.synced.wait(15)
        spec = running.admin.get(NODES + "fabric-node")["spec"]
        assert spec["fabric"] == {
            "domain": "ib:fec0:0000:0000:0001",
            "source": "infiniband",
            "ports": ["mlx5_0/1 InfiniBand 200 Gb/sec (4X HDR) subnet fec0:0000:0000:0001"],
            "notes": [],
        }
        table = running.admin.request(
            "GET", NODES + "fabric-node", accept="application/json;as=Table;v=v1;g=meta.k8s.io"
        )
        columns = [c["name"] for c in table["columnDefinitions"]]
        row = table["rows"][0]["cells"]
        assert row[columns.index("Fabric")] == "ib:fec0:0000:0000:0001"
    finally:
        running.stop()
        daemon.close()
