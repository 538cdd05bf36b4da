"""The extender's view of the cluster on /metrics: what its informers hold, read per scrape."""

from __future__ import annotations

import pytest

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.compute_quota import quota_of
from hcsd.cluster.extender import Extender
from hcsd.cluster.kube import Kube
from hcsd.contract.keyring import Keyring
from hcsd.contract.names import NAMESPACE, NODE_LEASE_PREFIX
from hcsd.profiles.database import ProfileDatabase
from tests.unit.fleet import GiB, add_node, assigned, beat, pod

DB = ProfileDatabase.load()
KEYS = Keyring({"k1": b"k" * 32}, "k1")


@pytest.fixture
def extender() -> Extender:
    return Extender(Kube.__new__(Kube), lambda: KEYS, DB)


def value(extender: Extender, name: str, **labels: str) -> float | None:
    return extender.metrics.registry.get_sample_value(name, labels)


def test_capacity_and_use_per_model_and_a_node_that_leaves(extender: Extender) -> None:
    add_node(extender, "n1", allocated={0: ("p1", 16)})
    add_node(extender, "n2", health=pb.HEALTH_STATE_UNHEALTHY)
    a100 = {"vendor": "nvidia", "model": "A100-SXM4-80GB"}
    assert value(extender, "hcs_cluster_vram_bytes", **a100) == 4 * 80 * GiB
    assert value(extender, "hcs_cluster_vram_allocated_bytes", **a100) == 16 * GiB
    assert value(extender, "hcs_cluster_acu", **a100) == pytest.approx(400.0)
    assert value(extender, "hcs_cluster_devices", **a100, health="unhealthy") == 2
    assert value(extender, "hcs_cluster_device_health", node="n2", device="n2-1", **a100,
                 health="unhealthy") == 1  # fmt: skip
    extender.state.nodes.apply("n2", None)  # the ComputeNode is deleted
    assert value(extender, "hcs_cluster_vram_bytes", **a100) == 2 * 80 * GiB
    assert value(extender, "hcs_cluster_devices", **a100, health="unhealthy") is None
    assert value(extender, "hcs_cluster_device_health", node="n2", device="n2-1", **a100,
                 health="unhealthy") is None  # fmt: skip


def test_compute_reserved_counts_in_acu(extender: Extender) -> None:
    add_node(extender, "n1")
    extender.state.pods.apply("ns/p", assigned("p", "n1", (0, 8)))
    a100 = {"vendor": "nvidia", "model": "A100-SXM4-80GB"}
    assert value(extender, "hcs_cluster_vram_allocated_bytes", **a100) == 8 * GiB
    assert value(extender, "hcs_cluster_acu_allocated", **a100) == 0  # VRAM only: no compute


def test_heartbeat_age_per_node(extender: Extender) -> None:
    add_node(extender, "n1")
    beat(extender, "n1", age=0.0)
    age = value(extender, "hcs_cluster_node_heartbeat_age_seconds", node="n1")
    assert age is not None and 0 <= age < 5


def test_quota_hard_and_used(extender: Extender) -> None:
    add_node(extender, "n1")
    extender.state.pods.apply("team/p", assigned("p", "n1", (0, 16), namespace="team"))
    quota = quota_of({"metadata": {"namespace": "team", "name": "q"},
                      "spec": {"hard": {"vram": "20Gi", "devices": 4}}})  # fmt: skip
    extender.state.quotas.apply("team/q", quota)
    labels = {"namespace": "team", "quota": "q"}
    assert value(extender, "hcs_cluster_quota", **labels, resource="vram_bytes", type="hard") == (
        20 * GiB
    )
    assert value(extender, "hcs_cluster_quota", **labels, resource="vram_bytes", type="used") == (
        16 * GiB
    )
    assert value(extender, "hcs_cluster_quota", **labels, resource="devices", type="used") == 1
    assert (
        value(extender, "hcs_cluster_quota", **labels, resource="tflops_fp16", type="hard") is None
    )


def test_pending_pods_until_bound(extender: Extender) -> None:
    add_node(extender, "n1")
    beat(extender, "n1")
    extender.filter(pod({"ai.compute/vram": "4096Gi"}, uid="big", namespace="a"), ["n1"])
    extender.filter(pod({"ai.compute/vram": "8Gi"}, uid="fits", namespace="a"), ["n1"])
    extender.filter(pod({"cpu": "1"}, uid="no-accelerator", namespace="a"), ["n1"])
    pending = "hcs_extender_pending_pods"
    assert value(extender, pending, namespace="a", phase="unschedulable") == 1
    assert value(extender, pending, namespace="a", phase="binding") == 1
    extender.metrics.pending.bound("fits")
    assert value(extender, pending, namespace="a", phase="binding") is None


def test_a_removed_node_leaves_no_heartbeat_behind(extender: Extender) -> None:
    add_node(extender, "gone")
    beat(extender, "gone")
    add_node(extender, "kept")
    beat(extender, "kept")
    assert value(extender, "hcs_cluster_node_heartbeat_stale", node="gone") == 0
    extender.state.leases.apply(f"{NAMESPACE}/{NODE_LEASE_PREFIX}gone", None)
    extender.state.nodes.apply("gone", None)  # the node is removed: Lease and ComputeNode
    for name in ("hcs_cluster_node_heartbeat_age_seconds", "hcs_cluster_node_heartbeat_stale"):
        assert value(extender, name, node="gone") is None
        assert value(extender, name, node="kept") is not None
    assert "gone" not in extender.state.snapshot().heartbeats  # not kept forever either


def test_a_lease_without_its_compute_node_exports_nothing(extender: Extender) -> None:
    beat(extender, "leased-only", age=300.0)
    assert value(extender, "hcs_cluster_node_heartbeat_age_seconds", node="leased-only") is None
    assert value(extender, "hcs_cluster_node_heartbeat_stale", node="leased-only") is None


@pytest.mark.parametrize(
    ("age", "duration", "stale"),
    [
        pytest.param(None, 40.0, 1, id="no-lease"),
        pytest.param(0.0, 40.0, 0, id="fresh"),
        pytest.param(50.0, 40.0, 1, id="older-than-its-lease"),
        pytest.param(50.0, 90.0, 0, id="a-longer-lease-seconds-vouches-longer"),
    ],
)
def test_stale_follows_the_lease_duration_as_the_filter_does(
    extender: Extender, age: float | None, duration: float, stale: int
) -> None:
    add_node(extender, "n1")
    if age is not None:
        beat(extender, "n1", age=age, duration=duration)
    assert value(extender, "hcs_cluster_node_heartbeat_stale", node="n1") == stale
    refused = extender.filter(pod({"ai.compute/vram": "1Gi"}), ["n1"]).passed == []
    assert refused == bool(stale)


def test_per_device_health_only_for_devices_not_healthy(extender: Extender) -> None:
    add_node(extender, "n1")
    a100 = {"vendor": "nvidia", "model": "A100-SXM4-80GB"}
    assert value(extender, "hcs_cluster_devices", **a100, health="healthy") == 2
    assert value(extender, "hcs_cluster_device_health", node="n1", device="n1-0", **a100,
                 health="healthy") is None  # fmt: skip


def test_pending_pods_only_while_leading(extender: Extender) -> None:
    leading = [True]
    extender.metrics.pending.is_leader = lambda: leading[0]
    add_node(extender, "n1")
    beat(extender, "n1")
    extender.filter(pod({"ai.compute/vram": "4096Gi"}, uid="big", namespace="a"), ["n1"])
    pending = "hcs_extender_pending_pods"
    assert value(extender, pending, namespace="a", phase="unschedulable") == 1
    leading[0] = False  # the lease moved: the new leader counts this pod from now on
    assert value(extender, pending, namespace="a", phase="unschedulable") is None


def test_scheduling_latency_reaches_hours(extender: Extender) -> None:
    extender.metrics.scheduling.observe(2 * 3600.0)
    assert value(extender, "hcs_extender_scheduling_seconds_bucket", le="3600.0") == 0
    assert value(extender, "hcs_extender_scheduling_seconds_bucket", le="10800.0") == 1


def test_a_sample_that_does_not_exist_reads_as_none_not_zero(extender: Extender) -> None:
    metrics = extender.metrics
    assert metrics.value("hcs_extender_requests_total", verb="filter") == 0  # exists, at 0
    assert metrics.value("hcs_extender_request_total", verb="filter") is None  # a wrong name
    assert metrics.value("hcs_extender_requests_total", verb="filtre") is None  # a wrong label
