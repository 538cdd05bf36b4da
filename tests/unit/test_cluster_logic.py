"""The cluster side's decisions without a cluster: demand parsing, planning, quotas, filter."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from typing import Any

import pytest

from hcsd.allocator import Usage
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.compute_quota import Amounts, QuotaError, quota_of
from hcsd.cluster.demand import DemandError, demand_of
from hcsd.cluster.extender import Extender
from hcsd.cluster.heartbeats import NodeLease
from hcsd.cluster.http import extender_args, filter_result, host_priorities
from hcsd.cluster.kube import Kube
from hcsd.cluster.objects import compute_node, node_spec, node_status, node_view
from hcsd.cluster.planner import Plan, plan, quick_fit, summarise
from hcsd.cluster.timefmt import micro_time
from hcsd.contract.dra import MODE_DRA, MODE_LABEL
from hcsd.contract.keyring import Keyring
from hcsd.model import HealthState
from hcsd.profiles.database import ProfileDatabase
from tests.conftest import GiB, gpu

DB = ProfileDatabase.load(None)


def KEYS() -> Keyring:
    return Keyring({"k": b"k" * 32}, "k")


def pod(limits: dict[str, str] | None, annotations: dict[str, str] | None = None,
        namespace: str = "ns", uid: str = "u1") -> dict[str, Any]:  # fmt: skip
    return {
        "metadata": {
            "name": "p",
            "namespace": namespace,
            "uid": uid,
            "annotations": annotations or {},
        },
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits or {}}}]},
    }


@pytest.mark.parametrize(
    ("limits", "annotations", "error"),
    [
        ({"ai.compute/vram": "16Gx"}, {}, "invalid quantity"),
        ({"ai.compute/vram": "0"}, {}, "must be positive"),
        ({"ai.compute/devices": "0"}, {}, "whole number 1..64"),
        ({"ai.compute/devices": "1.5"}, {}, "whole number 1..64"),
        ({"ai.compute/tflops-fp16": "-3"}, {}, "must be positive"),
        ({"ai.compute/vram": "1Gi"}, {"hcs.io/vendors": "intel"}, "unknown vendor 'intel'"),
        ({"ai.compute/vram": "1Gi"}, {"hcs.io/allow-substitution": "yes"}, '"true" or "false"'),
        ({"ai.compute/vram": "1Gi"}, {"hcs.io/topology-preference": "fast"}, "high-bandwidth"),
        ({"ai.compute/vram": "1Gi"}, {"hcs.io/models": "a100\nforged"}, "not a model name"),
        ({"ai.compute/vram": "1Gi"}, {"hcs.io/models": ",".join(["a100"] * 17)}, "at most 16"),
    ],
)
def test_malformed_demands_are_named(
    limits: dict[str, str], annotations: dict[str, str], error: str
) -> None:
    with pytest.raises(DemandError, match=error.replace("(", r"\(").replace(".", r"\.")):
        demand_of(pod(limits, annotations))


def test_demand_reads_limits_and_skips_pods_without_accelerators() -> None:
    assert demand_of(pod({"cpu": "1"})) is None
    demand = demand_of(pod({"ai.compute/vram": "16Gi", "ai.compute/devices": "2"},
                           {"hcs.io/vendors": "NVIDIA, ascend",
                            "hcs.io/allow-substitution": "true"}))  # fmt: skip
    assert demand is not None
    (container,) = demand.containers
    assert (container.vram_bytes, container.devices, container.tflops_fp16) == (16 * GiB, 2, None)
    assert {v.value for v in demand.vendors} == {"nvidia", "ascend"} and demand.substitution
    assert demand.vram_floor == 32 * GiB


def test_the_quick_path_chooses_what_the_allocator_chooses() -> None:
    rng = random.Random(7)
    for _ in range(400):
        devices = [
            gpu(i, vram_gib=rng.choice([32, 48, 80]), model=rng.choice(["A100-SXM4-80GB", "Z100"]),
                health=rng.choice([HealthState.HEALTHY] * 4 + [HealthState.UNHEALTHY]),
                score=rng.choice([100, 90, 60]))
            for i in range(rng.randint(1, 8))
        ]  # fmt: skip
        usage = {d.uuid: Usage(rng.choice([0, 8, 16, 30]) * GiB) for d in devices}
        want = rng.choice(["1Gi", "8Gi", "16Gi", "40Gi", "64Gi"])
        models = rng.choice([{}, {"hcs.io/models": "z100"}])
        demand = demand_of(pod({"ai.compute/vram": want}, models))
        assert demand is not None
        quick = quick_fit(demand, summarise(devices, usage))
        full = plan(demand, devices, usage, DB)
        if quick is None:  # nothing allowed and healthy: the allocator words the refusal
            assert not isinstance(full, Plan)
            continue
        score, reason = quick
        if isinstance(full, Plan):
            assert score == full.score, (devices, usage, want)
        else:
            assert score == -1 and reason == full.reason, (reason, full.reason)


def test_a_sub_health_degraded_device_is_scored_down() -> None:
    """hcsd reports a device held degraded by a sub-health signal with a score of at most
    health.subhealth_score (50): the extender's ranking, by score, places work elsewhere."""
    demand = demand_of(pod({"ai.compute/vram": "16Gi"}))
    assert demand is not None
    healthy = plan(demand, [gpu(0)], {}, DB)
    slow = plan(demand, [gpu(0, health=HealthState.DEGRADED, score=50)], {}, DB)
    assert isinstance(healthy, Plan) and isinstance(slow, Plan)
    assert slow.score < healthy.score
    quick = quick_fit(demand, summarise([gpu(0, health=HealthState.DEGRADED, score=50)], {}))
    assert quick == (slow.score, "")


def test_substitution_converts_through_fp16_tflops() -> None:
    mlus = [gpu(i, vram_gib=48, model="MLU370-X8", tflops=96.0) for i in range(4)]
    wants = {"ai.compute/devices": "1"}
    strict = demand_of(pod(wants, {"hcs.io/models": "A100-SXM4-80GB"}))
    loose = demand_of(
        pod(wants, {"hcs.io/models": "A100-SXM4-80GB", "hcs.io/allow-substitution": "true"})
    )
    assert strict is not None and loose is not None
    refused = plan(strict, mlus, {}, DB)
    assert not isinstance(refused, Plan) and "no device matches models" in refused.reason
    found = plan(loose, mlus, {}, DB)
    assert isinstance(found, Plan) and found.substituted
    assert len(found.grants["main"]) == 4  # ceil(312 / 96)


def test_quota_counts_grants_and_explains_the_excess() -> None:
    quota = quota_of({"metadata": {"name": "q", "namespace": "ns"},
                      "spec": {"hard": {"vram": "20Gi", "tflops-fp16": 100,
                                        "devices": "2"}}})  # fmt: skip
    assert quota.excess(Amounts(16 * GiB), Amounts(4 * GiB, 0, 1)) is None
    assert quota.excess(Amounts(16 * GiB), Amounts(8 * GiB, 0, 1)) == (
        "ComputeQuota ns/q: vram 16Gi used + 8Gi requested exceeds the limit 20Gi"
    )
    assert "devices 2 used + 1 requested" in str(quota.excess(Amounts(0, 0, 2), Amounts(1, 0, 1)))
    with pytest.raises(QuotaError, match="unknown key 'gpus'"):
        quota_of({"metadata": {"name": "q", "namespace": "ns"}, "spec": {"hard": {"gpus": 1}}})
    with pytest.raises(QuotaError, match="invalid quantity"):
        quota_of({"metadata": {"name": "q", "namespace": "ns"}, "spec": {"hard": {"vram": "lots"}}})


def _node_object(
    name: str, count: int = 2, health: int = pb.HEALTH_STATE_HEALTHY
) -> dict[str, Any]:
    devices = [pb.Device(uuid=f"{name}-{i}", vendor="nvidia", model="A100-SXM4-80GB", index=i,
                         vram_bytes=80 * GiB, tflops_fp16=312, health_score=100,
                         health_state=health)
               for i in range(count)]  # fmt: skip
    obj = compute_node(name, node_spec(pb.Node(name=name, version="0.1.0"), devices))
    obj["status"] = node_status(devices, [], previous={}, now="2026-01-01T00:00:00Z")
    obj["metadata"]["resourceVersion"] = "1"
    return obj


def test_node_status_keeps_transition_times_so_resyncs_do_not_write() -> None:
    devices = [
        pb.Device(
            uuid="a",
            vendor="nvidia",
            model="m",
            vram_bytes=GiB,
            health_state=pb.HEALTH_STATE_HEALTHY,
        )
    ]
    first = node_status(devices, [], previous={}, now="2026-01-01T00:00:00Z")
    again = node_status(devices, [], previous=first, now="2026-01-02T00:00:00Z")
    assert again == first
    devices[0].health_state = pb.HEALTH_STATE_UNHEALTHY
    changed = node_status(devices, [], previous=first, now="2026-01-03T00:00:00Z")
    assert changed["phase"] == "NotReady"
    assert {c["lastTransitionTime"] for c in changed["conditions"]} == {"2026-01-03T00:00:00Z"}


def test_the_ready_message_names_each_device_not_healthy_with_its_cause() -> None:
    """A node with only degraded devices said "Degraded" with an empty message."""
    devices = [
        pb.Device(uuid="a", vendor="nvidia", health_state=pb.HEALTH_STATE_HEALTHY),
        pb.Device(
            uuid="b",
            vendor="nvidia",
            health_state=pb.HEALTH_STATE_DEGRADED,
            attributes={"health_cause": "pcie-link-width", "subhealth": "pcie-link-width"},
        ),
        pb.Device(
            uuid="c",
            vendor="nvidia",
            health_state=pb.HEALTH_STATE_UNHEALTHY,
            attributes={"health_cause": "xid-79 (fatal)"},
        ),
    ]
    status = node_status(devices, [], previous={}, now="2026-01-01T00:00:00Z")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["reason"], ready["message"]) == (
        "SomeDevicesUnhealthy",
        "b degraded: pcie-link-width; c unhealthy: xid-79 (fatal)",
    )
    assert status["subhealth"] == "b: pcie-link-width"
    assert "nodeSubhealth" not in status


@pytest.fixture
def extender() -> Extender:
    """An extender whose caches are filled as its informers fill them (no server runs)."""
    e = Extender(Kube.__new__(Kube), KEYS, DB)
    for name in ("fresh", "stale"):
        e.state.nodes.apply(name, node_view(_node_object(name)))
    e.state.nodes.apply("sick", node_view(_node_object("sick", health=pb.HEALTH_STATE_UNHEALTHY)))
    for name, age in (("fresh", 0), ("sick", 0), ("stale", 100)):
        # First sight of a Lease: its renewTime counts, against this machine's clock.
        lease = NodeLease(name, micro_time(time.time() - age), 40)
        e.state.leases.apply(f"hcs-system/hcs-node-{name}", lease)
    return e


def filter_(extender: Extender, body: dict[str, Any]) -> dict[str, Any]:
    """/filter as kube-scheduler sees it, without the socket."""
    answer: dict[str, Any] = json.loads(filter_result(extender.filter(*extender_args(body))))
    return answer


def test_filter_names_every_refusal(extender: Extender) -> None:
    names = ["fresh", "stale", "sick", "unknown"]
    answer = filter_(extender, {"Pod": pod({"ai.compute/vram": "16Gi"}), "NodeNames": names})
    assert answer["NodeNames"] == ["fresh"]
    failed = answer["FailedNodes"]
    assert failed["stale"].startswith("hcs heartbeat is 100s old (limit 40s)")
    assert failed["sick"] == "ComputeNode is NotReady (no healthy accelerator)"
    assert failed["unknown"] == "node has no ComputeNode (is hcs-syncer running on it?)"
    too_big = filter_(extender, {"Pod": pod({"ai.compute/vram": "96Gi"}), "NodeNames": ["fresh"]})
    assert too_big["FailedNodes"] == {
        "fresh": "container main: A100-SXM4-80GB: 96Gi wanted, "
        "most free is 80Gi on A100-SXM4-80GB#0"
    }
    bad = filter_(extender, {"Pod": pod({"ai.compute/vram": "many"}), "NodeNames": ["fresh"]})
    assert "invalid quantity 'many'" in bad["FailedNodes"]["fresh"]


@pytest.mark.parametrize(
    "limits",
    [{"ai.compute/vram": "16Gi"}, {"ai.compute/devices": "2"}],
    ids=["one slice (all nodes at once)", "whole devices (node by node)"],
)
def test_the_extender_offers_nothing_on_a_node_in_dra_mode(
    extender: Extender, limits: dict[str, str]
) -> None:
    """A ComputeNode labelled hcs.io/mode=dra (its syncer publishes a ResourceSlice): its
    devices are kube-scheduler's to allocate, so the extender never places pods there too."""
    obj = _node_object("dra")
    obj["metadata"]["labels"][MODE_LABEL] = MODE_DRA
    extender.state.nodes.apply("dra", node_view(obj))
    extender.state.leases.apply(
        "hcs-system/hcs-node-dra", NodeLease("dra", micro_time(time.time()), 40)
    )
    answer = filter_(extender, {"Pod": pod(limits), "NodeNames": ["fresh", "dra"]})
    assert answer["NodeNames"] == ["fresh"]
    assert answer["FailedNodes"]["dra"].startswith("node is in DRA mode (hcs.io/mode=dra)")
    scores = json.loads(host_priorities(extender.prioritize(pod({"ai.compute/vram": "16Gi"}),
                                                            ["fresh"])))  # fmt: skip
    assert (
        scores == [{"Host": "fresh", "Score": scores[0]["Score"]}] and 0 < scores[0]["Score"] <= 10
    )


def test_filter_enforces_quota(extender: Extender) -> None:
    extender.state.quotas.apply("ns/q", quota_of(
        {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"hard": {"vram": "10Gi"}}}
    ))  # fmt: skip
    answer = filter_(extender, {"Pod": pod({"ai.compute/vram": "16Gi"}), "NodeNames": ["fresh"]})
    assert answer["NodeNames"] == []
    assert answer["FailedNodes"]["fresh"] == (
        "ComputeQuota ns/q: vram 0 used + 16Gi requested exceeds the limit 10Gi"
    )


@pytest.mark.parametrize(
    "hosts",
    [
        pytest.param(["node-a", "node-b"], id="plain"),
        pytest.param(["node-a\nnode-b"], id="newline-inside"),
        pytest.param(["node-a\n", "node-b"], id="newline-at-the-end"),
        pytest.param(["node-a", "\nnode-b"], id="newline-at-the-start"),
        pytest.param(["a" * 254], id="too-long"),
        pytest.param(['"', "x"], id="quote"),
    ],
)
def test_host_priorities_is_valid_json_whatever_the_names(hosts: list[str]) -> None:
    scores = [(h, i % 11) for i, h in enumerate(hosts)]
    assert json.loads(host_priorities(scores)) == [{"Host": h, "Score": s} for h, s in scores]


def _with_uuid(device: Any, uuid: str) -> Any:
    return dataclasses.replace(device, uuid=uuid)


@pytest.mark.parametrize(
    ("devices", "usage", "want"),
    [
        # Two models tie on (free, health, index): the allocator takes the first group in
        # (vendor, model) order, case-sensitive ("B100" before "a100"); their VRAM differs.
        pytest.param(
            [gpu(0, model="a100"), _with_uuid(gpu(0, model="B100", vram_gib=96), "dev-b")],
            {"dev-b": Usage(16 * GiB)}, "10Gi", id="groups-ordered-case-sensitive",
        ),
        # The most free VRAM on two devices: the refusal names the first in node order.
        pytest.param(
            [gpu(1), gpu(0)], {"dev-0": Usage(70 * GiB), "dev-1": Usage(70 * GiB)}, "20Gi",
            id="tied-top-in-node-order",
        ),
    ],
)  # fmt: skip
def test_quick_fit_answers_as_the_allocator_on_ties(
    devices: list[Any], usage: dict[str, Usage], want: str
) -> None:
    demand = demand_of(pod({"ai.compute/vram": want}))
    assert demand is not None
    full = plan(demand, devices, usage, DB)
    expected = (full.score, "") if isinstance(full, Plan) else (-1, full.reason)
    assert quick_fit(demand, summarise(devices, usage)) == expected
