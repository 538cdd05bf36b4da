"""The DRA mode's ResourceSlices against a real kube-apiserver and kube-scheduler 1.36: what
hcs-syncer publishes (from a real hcsd), when it writes, the device taints, what the
ValidatingAdmissionPolicy lets a node's syncer write, and that kube-scheduler allocates
claims on the slices as HCS means them to be read (memory shared, a tainted device avoided).
Nodes are Node objects without a kubelet: the scheduler allocates and binds, nothing runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hcsd.api.client import Client
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.compute_quota import Amounts
from hcsd.cluster.dra_slices import slice_name
from hcsd.cluster.kube import Kube, KubeError
from hcsd.cluster.objects import compute_node, node_spec
from hcsd.cluster.quota_status import QuotaStatusWriter
from hcsd.cluster.slice_publisher import SlicePublisher
from hcsd.cluster.state import ClusterState
from hcsd.cluster.syncer import Syncer, SyncerSettings
from hcsd.contract import dra
from hcsd.contract.keyring import Keyring
from hcsd.quantity import parse_quantity
from tests.cluster.conftest import _requirements, kustomized
from tests.cluster.controlplane import REPO, ControlPlane, manifests, register_node
from tests.harness.daemon import Daemon
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.slow

GiB = 2**30
SLICES = "/apis/resource.k8s.io/v1/resourceslices/"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
PODS = "/api/v1/namespaces/default/pods"
NODES = "/apis/hcs.io/v1alpha1/computenodes/"
DRA_TREE = REPO / "packaging" / "kubernetes-dra"
KEYS = Keyring({"k1": b"0" * 32}, "k1")


def dra_objects() -> list[dict[str, Any]]:
    """What `kubectl apply -k packaging/kubernetes-dra` adds to the tree."""
    return [d for d in yaml.safe_load_all((DRA_TREE / "dra.yaml").read_text()) if d]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The shipped manifests with the DRA overlay, and kube-scheduler's default profile (no
    extender: DRA needs none)."""
    binaries, etcd = _requirements()
    plane = ControlPlane(binaries, etcd, tmp_path_factory.mktemp("dra")).start()
    try:
        shipped = [d for d in manifests(*kustomized()) if d["kind"] != "Secret"]
        plane.apply(shipped + dra_objects())
        plane.start_scheduler(None)
        yield plane
    finally:
        plane.stop()


def device(
    vendor: str,
    index: int,
    model: str,
    vram: int,
    *,
    health: pb.HealthState = pb.HEALTH_STATE_HEALTHY,
    peers: tuple[str, ...] = (),
    link: str = "",
) -> pb.Device:
    """A device as hcsd's API reports it."""
    return pb.Device(
        uuid=f"{vendor}-uuid-{index}",
        vendor=vendor,
        model=model,
        index=index,
        pci_bus_id=f"0000:{0x17 + index:02x}:00.0",
        numa_node=index // 4,
        vram_bytes=vram,
        tflops_fp16=312.0,
        links=[pb.Link(peer_uuid=p, kind=link, gbps=300.0) for p in peers],
        health_state=health,
    )


def a100s(*, bad: int | None = None) -> list[pb.Device]:
    uuids = ("nvidia-uuid-0", "nvidia-uuid-1")
    return [
        device(
            "nvidia",
            i,
            "A100-SXM4-80GB",
            80 * GiB,
            health=pb.HEALTH_STATE_UNHEALTHY if i == bad else pb.HEALTH_STATE_HEALTHY,
            peers=tuple(u for u in uuids if u != uuids[i]),
            link="nvlink",
        )
        for i in range(2)
    ]


# --- what the syncer publishes -------------------------------------------------------------


def test_the_syncer_publishes_hcsd_devices_once_and_labels_its_compute_node(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    hcsd = Daemon(tmp_path)
    hcsd.start()
    node = "dra-synced"
    syncer = Syncer(
        SyncerSettings(
            node_name=node,
            socket_path=hcsd.socket,
            mode=dra.MODE_DRA,
            lease_seconds=3,
            renew=0.3,
            settle=0.1,
            resync=1.0,
        ),
        cluster.syncer_kube(node),  # its pod's token: the slice policy needs the node
    )
    thread = threading.Thread(target=syncer.run, daemon=True)
    thread.start()
    admin = cluster.kube()
    try:
        assert syncer.synced.wait(15)
        assert syncer.slices is not None
        found = admin.get(SLICES + slice_name(node))
        spec = found["spec"]
        with Client(hcsd.socket) as client:
            devices = client.devices()
        assert spec["driver"] == dra.DRIVER and spec["nodeName"] == node
        assert spec["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 1}
        assert [d["name"] for d in spec["devices"]] == sorted(
            f"{d.vendor}-{d.index}" for d in devices
        )
        first = min(devices, key=lambda d: (d.vendor, d.index))
        entry = spec["devices"][0]
        assert entry["attributes"][dra.ATTR_UUID] == {"string": first.uuid}
        assert entry["attributes"][dra.ATTR_MODEL] == {"string": first.model}
        assert entry["attributes"][dra.ATTR_INDEX] == {"int": first.index}
        assert entry["allowMultipleAllocations"] is True
        memory = entry["capacity"][dra.CAPACITY_MEMORY]
        assert parse_quantity(memory["value"]) == first.vram_bytes
        step = parse_quantity(memory["requestPolicy"]["validRange"]["step"])
        assert step == dra.MEMORY_STEP_BYTES
        assert parse_quantity(entry["capacity"][dra.CAPACITY_COMPUTE]["value"]) == 100
        labels = admin.get(NODES + node)["metadata"]["labels"]
        assert labels[dra.MODE_LABEL] == dra.MODE_DRA
        # Resyncs read it back and find it current; a new allocation is usage, not inventory.
        with Client(hcsd.socket) as client:
            client.allocate(pb.AllocateRequest(container_id="share", vram="1Gi"))
        wait_for(lambda: syncer.writes["status"] >= 2, what="the allocation in the status")
        time.sleep(2.5)  # two resyncs
        assert dict(syncer.slices.writes) == {"create": 1}
        assert syncer.writes["mode"] == 1
        assert admin.get(SLICES + slice_name(node))["spec"]["pool"]["generation"] == 1
    finally:
        syncer.stop()
        thread.join(10)
        hcsd.close()
        admin.close()


NODE = """
[[device]]
uuid = "GPU-dra-0"
vendor = "nvidia"
model = "A100-SXM4-80GB"
index = 0
pci_bus_id = "0000:17:00.0"
vram = "80Gi"
nodes = ["/dev/nvidia0:195:0"]
counters = {{ ecc_uncorrectable = {errors} }}

[[device]]
uuid = "GPU-dra-1"
vendor = "nvidia"
model = "A100-SXM4-80GB"
index = 1
pci_bus_id = "0000:18:00.0"
vram = "80Gi"
nodes = ["/dev/nvidia1:195:1"]
"""


def test_a_device_hcsd_finds_unhealthy_is_tainted_until_it_recovers(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    """The whole path: a fatal ECC count on the simulated device, hcsd's health watcher marks
    it unhealthy, the syncer's next pass taints it in the slice; quiet for `quiet_period`,
    hcsd calls it healthy again and the taint goes."""
    node_file = tmp_path / "node.toml"
    node_file.write_text(NODE.format(errors=0))
    hcsd = Daemon(
        tmp_path / "hcsd",
        node_file=node_file,
        settings={
            "health": {"quiet_period": 3.0, "tick_interval": 0.2, "aer_poll_interval": 0.2},
        },
    )
    hcsd.start()
    node = "dra-ecc"
    syncer = Syncer(
        SyncerSettings(
            node_name=node, socket_path=hcsd.socket, mode=dra.MODE_DRA, lease_seconds=3,
            renew=0.3, settle=0.1,
        ),
        cluster.syncer_kube(node),
    )  # fmt: skip
    thread = threading.Thread(target=syncer.run, daemon=True)
    thread.start()
    admin = cluster.kube()

    def tainted() -> list[str]:
        spec = admin.get(SLICES + slice_name(node))["spec"]
        return [t["value"] for d in spec["devices"] for t in d.get("taints") or ()]

    try:
        assert syncer.synced.wait(15) and tainted() == []
        node_file.write_text(NODE.format(errors=1))
        wait_for(lambda: tainted() == ["unhealthy"], timeout=20, what="nvidia-0 tainted")
        spec = admin.get(SLICES + slice_name(node))["spec"]
        assert [bool(d.get("taints")) for d in spec["devices"]] == [True, False]
        wait_for(lambda: tainted() == [], timeout=20, what="the taint gone on recovery")
        assert syncer.slices is not None
        assert dict(syncer.slices.writes) == {"create": 1, "update": 2}
    finally:
        syncer.stop()
        thread.join(10)
        hcsd.close()
        admin.close()


def test_a_change_is_one_write_with_the_next_generation_and_taints_follow_health(
    cluster: ControlPlane,
) -> None:
    node = "dra-health"
    publisher = SlicePublisher(cluster.syncer_kube(node), node)
    admin = cluster.kube()

    def stored() -> dict[str, Any]:
        spec: dict[str, Any] = admin.get(SLICES + slice_name(node))["spec"]
        return spec

    def taints(spec: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
        return {d["name"]: d.get("taints") or [] for d in spec["devices"]}

    assert publisher.publish(a100s())
    assert not publisher.publish(a100s())  # nothing changed: nothing written
    domains = {d["attributes"][dra.ATTR_LINK_DOMAIN]["string"] for d in stored()["devices"]}
    assert domains == {"nvidia-nvlink-0"}  # one NVLink island
    assert publisher.publish(a100s(bad=1))
    spec = stored()
    assert spec["pool"]["generation"] == 2
    (taint,) = taints(spec)["nvidia-1"]
    assert taints(spec)["nvidia-0"] == []
    assert (taint["key"], taint["value"], taint["effect"]) == (
        dra.TAINT_UNHEALTHY,
        "unhealthy",
        "NoSchedule",
    )
    assert taint["timeAdded"]  # the API server's stamp, kept by the next passes
    publisher.forget()  # as after a restart: read back, compare, write nothing
    assert not publisher.publish(a100s(bad=1))
    assert publisher.publish(a100s())  # recovered: the taint goes
    spec = stored()
    assert spec["pool"]["generation"] == 3 and taints(spec) == {"nvidia-0": [], "nvidia-1": []}
    assert dict(publisher.writes) == {"create": 1, "update": 2}
    # Someone else's edit is repaired on the next read-back.
    edited = admin.get(SLICES + slice_name(node))
    edited["spec"]["devices"] = edited["spec"]["devices"][:1]
    admin.replace(SLICES + slice_name(node), edited)
    publisher.forget()
    assert publisher.publish(a100s())
    assert [d["name"] for d in stored()["devices"]] == ["nvidia-0", "nvidia-1"]
    admin.close()


def test_no_execute_is_the_taint_the_operator_asked_for(cluster: ControlPlane) -> None:
    node = "dra-noexecute"
    publisher = SlicePublisher(cluster.syncer_kube(node), node, taint_effect="NoExecute")
    publisher.publish(a100s(bad=0))
    admin = cluster.kube()
    spec = admin.get(SLICES + slice_name(node))["spec"]
    assert [t["effect"] for t in spec["devices"][0]["taints"]] == ["NoExecute"]
    admin.close()


def test_a_syncer_may_write_only_its_own_nodes_slice(cluster: ControlPlane) -> None:
    """hcs-syncer-own-slice (packaging/kubernetes-dra/dra.yaml): the name, the node and the
    pool must be the token's node."""
    mine = cluster.syncer_kube("dra-mine")
    for name, node in (
        (slice_name("dra-other"), "dra-other"),  # another node's slice
        (slice_name("dra-mine"), "dra-other"),  # its own name, devices on another node
    ):
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": dra.DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [],
            },
        }
        with pytest.raises(KubeError) as refused:
            mine.create(SLICES.rstrip("/"), body)
        assert refused.value.status == 403 and "hcs-syncer of node dra-mine" in str(refused.value)
    # The RBAC is exactly what the publisher calls: it cannot list or delete slices.
    with pytest.raises(KubeError) as listing:
        mine.get(SLICES.rstrip("/"))
    assert listing.value.status == 403
    mine.close()


# --- kube-scheduler allocating on the slices ----------------------------------------------


def claim(name: str, device_class: str, memory: str, compute: int | None = None) -> dict[str, Any]:
    requests = {dra.CAPACITY_MEMORY: memory}
    if compute is not None:
        requests[dra.CAPACITY_COMPUTE] = str(compute)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "acc",
                        "exactly": {
                            "deviceClassName": device_class,
                            "capacity": {"requests": requests},
                        },
                    }
                ]
            }
        },
    }


def pod_with(name: str, claim_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "resourceClaims": [{"name": "acc", "resourceClaimName": claim_name}],
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "acc"}]}}
            ],
        },
    }


def run_claim(kube: Kube, name: str, body: dict[str, Any]) -> None:
    kube.create(CLAIMS, body)
    kube.create(PODS, pod_with(name, body["metadata"]["name"]))


def results(kube: Kube, name: str) -> list[dict[str, Any]]:
    status = kube.get(f"{CLAIMS}/{name}").get("status") or {}
    found: list[dict[str, Any]] = ((status.get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or []
    return found


def bound(kube: Kube, name: str) -> str:
    return str(kube.get(f"{PODS}/{name}")["spec"].get("nodeName") or "")


def unschedulable(kube: Kube, name: str) -> str:
    """PodScheduled's message when kube-scheduler gave up on the pod for now, else ""."""
    for c in (kube.get(f"{PODS}/{name}").get("status") or {}).get("conditions") or ():
        if c["type"] == "PodScheduled" and c["status"] == "False":
            return str(c.get("message") or "unschedulable")
    return ""


@pytest.fixture(scope="module")
def fleet(cluster: ControlPlane) -> Kube:
    """Two fake nodes: 2 NVLinked A100 80GB (the first unhealthy) and one Ascend 910B 64GB,
    and no other slice (the tests above leave theirs)."""
    admin = cluster.kube()
    for old in admin.get(SLICES.rstrip("/"))["items"]:
        admin.request("DELETE", SLICES + old["metadata"]["name"])
    for node, devices in (
        ("dra-gpu", a100s(bad=0)),
        ("dra-npu", [device("ascend", 0, "Ascend910B3", 64 * GiB)]),
    ):
        register_node(admin, node)
        SlicePublisher(cluster.syncer_kube(node), node).publish(devices)
        # its ComputeNode, as a DRA-mode syncer keeps it: where quotas read TFLOPS from
        body = compute_node(node, node_spec(pb.Node(name=node), devices))
        body["metadata"]["labels"][dra.MODE_LABEL] = dra.MODE_DRA
        admin.create(NODES.rstrip("/"), body)
    return admin


def test_kube_scheduler_allocates_a_memory_share_on_the_right_device(fleet: Kube) -> None:
    run_claim(fleet, "npu-16g", claim("npu-16g", dra.vendor_class("ascend"), "16Gi", 25))
    wait_for(lambda: bound(fleet, "npu-16g"), timeout=30, what="the pod bound")
    assert bound(fleet, "npu-16g") == "dra-npu"
    (result,) = results(fleet, "npu-16g")
    assert (result["driver"], result["pool"], result["device"]) == (
        dra.DRIVER,
        "dra-npu",
        "ascend-0",
    )
    consumed = {k: parse_quantity(v) for k, v in result["consumedCapacity"].items()}
    assert consumed == {dra.CAPACITY_MEMORY: 16 * GiB, dra.CAPACITY_COMPUTE: 25}
    assert result.get("shareID")  # one share of a device that allows several


def test_two_claims_share_one_devices_memory_and_a_third_does_not_fit(fleet: Kube) -> None:
    """ascend-0 has 64Gi: two claims of 20Gi share it (beside the test above's 16Gi), a
    third that asks more than is left waits."""
    for name in ("npu-a", "npu-b"):
        run_claim(fleet, name, claim(name, dra.model_class("ascend", "Ascend910B3"), "20Gi"))
    for name in ("npu-a", "npu-b"):
        wait_for(lambda n=name: bound(fleet, n), timeout=30, what=f"{name} bound")  # type: ignore[misc]
    a, b = results(fleet, "npu-a")[0], results(fleet, "npu-b")[0]
    assert a["device"] == b["device"] == "ascend-0" and a["shareID"] != b["shareID"]
    # No compute named: none reserved.
    assert parse_quantity(a["consumedCapacity"][dra.CAPACITY_COMPUTE]) == 0
    # 24Gi left, 8Gi after the test above: 30Gi fits neither way
    run_claim(fleet, "npu-c", claim("npu-c", dra.vendor_class("ascend"), "30Gi"))
    wait_for(lambda: unschedulable(fleet, "npu-c"), timeout=30, what="npu-c refused")
    assert results(fleet, "npu-c") == [] and bound(fleet, "npu-c") == ""


def test_a_tainted_device_is_avoided(fleet: Kube) -> None:
    """nvidia-0 is unhealthy: four claims that would fit on either device all get nvidia-1."""
    names = [f"gpu-{i}" for i in range(4)]
    for name in names:
        run_claim(fleet, name, claim(name, dra.vendor_class("nvidia"), "8Gi"))
    for name in names:
        wait_for(lambda n=name: bound(fleet, n), timeout=30, what=f"{name} bound")  # type: ignore[misc]
    assert {results(fleet, n)[0]["device"] for n in names} == {"nvidia-1"}
    assert {bound(fleet, n) for n in names} == {"dra-gpu"}


def test_compute_quota_counts_what_the_allocated_claims_consumed(
    cluster: ControlPlane, fleet: Kube
) -> None:
    """The extender with --count-claims, as its service account (the DRA overlay's RBAC):
    the namespace's usage is the claims' consumed memory, their reserved compute share in
    FP16 TFLOPS of the device, and one device each; the ComputeQuota's status says so."""
    fleet.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                        "metadata": {"name": "dra-quota"}})  # fmt: skip
    fleet.create(
        "/apis/hcs.io/v1alpha1/namespaces/dra-quota/computequotas",
        {"apiVersion": "hcs.io/v1alpha1", "kind": "ComputeQuota",
         "metadata": {"name": "team", "namespace": "dra-quota"},
         "spec": {"hard": {"ai.compute/vram": "100Gi"}}},
    )  # fmt: skip
    for name, memory, compute in (("q-half", "8Gi", 50), ("q-share", "16Gi", None)):
        body = claim(name, dra.vendor_class("nvidia"), memory, compute)
        body["metadata"]["namespace"] = "dra-quota"
        fleet.create(CLAIMS.replace("/default/", "/dra-quota/"), body)
        pod = pod_with(name, name)
        pod["metadata"]["namespace"] = "dra-quota"
        fleet.create(PODS.replace("/default/", "/dra-quota/"), pod)
    pods = PODS.replace("/default/", "/dra-quota/")
    for name in ("q-half", "q-share"):
        wait_for(lambda n=name: fleet.get(f"{pods}/{n}")["spec"].get("nodeName"), timeout=30,  # type: ignore[misc]
                 what=f"{name} bound")  # fmt: skip
    extender = cluster.kube("extender")
    state = ClusterState(extender, keys=lambda: KEYS, claims=True).start()
    try:
        assert state.wait_synced(30)
        wait_for(lambda: state.namespace_usage("dra-quota").devices == 2, what="both claims")
        used = state.namespace_usage("dra-quota")
        # nvidia-1 (312 TFLOPS): half of it reserved by one claim, none by the other
        assert used == Amounts(vram=24 * GiB, tflops=156.0, devices=2)
        assert QuotaStatusWriter(extender, state).write_changed() >= 1
        status = fleet.get("/apis/hcs.io/v1alpha1/namespaces/dra-quota/computequotas/team")
        assert status["status"]["used"] == used.as_status()
    finally:
        state.stop()
        extender.close()
