"""The extender's view of the cluster on /metrics: what its informers hold, read per scrape."""

from __future__ import annotations

import pytest

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.compute_quota import quota_of
from hcsd.cluster.extender import Extender
from hcsd.cluster.kube import Kube
from hcsd.contract.keyring import Keyring
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
