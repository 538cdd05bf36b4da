"""The fast paths decide what the allocator decides: on random fleets (mixed vendors and
nodes, usage from status and from pods, unhealthy devices, links, stale and missing
heartbeats, nodes without the signing key, devices of different models and vendors tied on
free VRAM, health and index, devices listed out of index order, namespace quotas, nodes wider
than a fleet row), for many demand kinds, each node's (score, why
not, amounts) from the extender's filter and prioritize equals `planner.plan`'s, the
reference, for the same pod and node; so does the node-by-node answer a verdict's refresh
uses. The bulk path leaves no node to the node-by-node decision but those its rows cannot
hold. Then the fleet churns (nodes change, go, come back) and it holds again."""

from __future__ import annotations

import random
import re
import time
from typing import Any

import pytest

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.bulk import BulkVerdict, one_slice
from hcsd.cluster.compute_quota import Amounts, quota_of
from hcsd.cluster.decisions import (
    NOTHING,
    floor_of,
    lacks_key,
    over_quota,
    plan_amounts,
    unusable,
)
from hcsd.cluster.extender import Extender
from hcsd.cluster.fleet import WIDTH
from hcsd.cluster.kube import Kube
from hcsd.cluster.objects import compute_node, node_spec, node_status, node_view
from hcsd.cluster.planner import Unfit, plan
from hcsd.cluster.runtime_profiles import runtime_profile
from hcsd.cluster.state import Answer, Snapshot
from hcsd.contract.keyring import Keyring
from hcsd.profiles.database import ProfileDatabase
from tests.unit.fleet import GiB, assigned, beat, pod

DB = ProfileDatabase.load(None)
MiB = 2**20
MODELS = [  # vendor, model, VRAM GiB, FP16 TFLOPS, link kind, GB/s
    ("nvidia", "A100-SXM4-80GB", 80, 312.0, "nvlink", 300.0),
    ("nvidia", "H800", 80, 756.0, "nvlink", 400.0),  # ties with the A100s' free VRAM
    ("nvidia", "A100-PCIE-40GB", 40, 312.0, "pcie-switch", 32.0),
    ("ascend", "Ascend910B3", 64, 313.0, "hccs", 56.0),
    ("cambricon", "MLU370-X8", 48, 96.0, "mlulink", 100.0),
    ("hygon", "Z100", 32, 24.5, "xgmi", 92.0),
]
STATES = [pb.HEALTH_STATE_HEALTHY] * 8 + [
    pb.HEALTH_STATE_DEGRADED,
    pb.HEALTH_STATE_UNHEALTHY,
    pb.HEALTH_STATE_LOST,
]
DEMANDS: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "vram-1Gi": ({"ai.compute/vram": "1Gi"}, {}),
    "vram-16Gi": ({"ai.compute/vram": "16Gi"}, {}),
    "vram-2500Mi": ({"ai.compute/vram": "2500Mi"}, {}),
    "vram-40Gi": ({"ai.compute/vram": "40Gi"}, {}),
    "vram-63Gi": ({"ai.compute/vram": "63Gi"}, {}),
    "vram-80Gi": ({"ai.compute/vram": "80Gi"}, {}),
    "vram-100Gi": ({"ai.compute/vram": "100Gi"}, {}),
    "vram-nvidia": ({"ai.compute/vram": "24Gi"}, {"hcs.io/vendors": "nvidia"}),
    "vram-ascend-hygon": ({"ai.compute/vram": "20Gi"}, {"hcs.io/vendors": "ascend,hygon"}),
    "vram-alias-A100": ({"ai.compute/vram": "30Gi"}, {"hcs.io/models": "A100"}),
    "vram-two-models": ({"ai.compute/vram": "30Gi"}, {"hcs.io/models": "MLU370-X8,Z100"}),
    "vram-unknown-model": ({"ai.compute/vram": "8Gi"}, {"hcs.io/models": "nope"}),
    "vram-linked-1": ({"ai.compute/vram": "8Gi"}, {"hcs.io/topology-preference": "high-bandwidth"}),
    "whole-device": ({"ai.compute/devices": "1"}, {}),
    "2-devices": ({"ai.compute/devices": "2", "ai.compute/vram": "20Gi"}, {}),
    "2-devices-linked": ({"ai.compute/devices": "2"},
                         {"hcs.io/topology-preference": "high-bandwidth"}),
    "tflops-100": ({"ai.compute/tflops-fp16": "100"}, {}),
    "tflops-substitution": ({"ai.compute/tflops-fp16": "200"},
                            {"hcs.io/models": "A100", "hcs.io/allow-substitution": "true"}),
    "vram-substitution": ({"ai.compute/vram": "16Gi"},
                          {"hcs.io/models": "Z100", "hcs.io/allow-substitution": "true"}),
    # RuntimeProfiles (PROFILES): only devices an entry has an image for; "a100-or-ascend"
    # is what hcs.io/vendors and hcs.io/models together cannot say.
    "profile-a100-or-ascend": ({"ai.compute/vram": "30Gi"},
                               {"hcs.io/runtime-profile": "a100-or-ascend"}),
    "profile-and-vendors": ({"ai.compute/vram": "8Gi"}, {"hcs.io/runtime-profile": "a100-or-ascend",
                                                         "hcs.io/vendors": "ascend"}),
    "profile-hygon-whole": ({"ai.compute/devices": "1"}, {"hcs.io/runtime-profile": "hygon"}),
    "profile-hygon-2-devices": ({"ai.compute/devices": "2"}, {"hcs.io/runtime-profile": "hygon"}),
}  # fmt: skip
PROFILES = {
    "a100-or-ascend": [{"vendor": "nvidia", "models": ["A100"], "image": "cuda:1"},
                       {"vendor": "ascend", "image": "cann:1"}],
    "hygon": [{"vendor": "hygon", "image": "dtk:1"}],
}  # fmt: skip


def with_profiles(extender: Extender) -> Extender:
    """The extender's RuntimeProfiles informer, filled with PROFILES."""
    for name, runtimes in PROFILES.items():
        obj = {"metadata": {"name": name, "resourceVersion": "1"}, "spec": {"runtimes": runtimes}}
        extender.state.profiles.apply(name, runtime_profile(obj))
    extender.state.profiles.synced.set()
    return extender


def random_node(name: str, rng: random.Random, version: int) -> dict[str, Any]:
    """A ComputeNode as the syncer writes it: one or two chip models, devices listed in any
    order, usage in GiB or odd MiB, links between some of them."""
    kinds = rng.sample(MODELS, rng.choice([1, 1, 1, 2, 2, 3]))
    specs = [kind for kind in kinds for _ in range(rng.choice([1, 2, 4, 8, 16]))]
    # Each model counts its own indexes (0, 1, ... per model, so devices of different models
    # and vendors tie on index), or every device has index 0 or 1 (ties within a model too).
    per_model = [specs[:i].count(spec) for i, spec in enumerate(specs)]
    indexes = rng.choice([per_model, per_model, [i % 2 for i in per_model]])
    order = list(range(len(specs)))
    if rng.random() < 0.5:
        rng.shuffle(order)
    devices, allocations = [], []
    for position, i in enumerate(order):
        vendor, model, vram, tflops, kind, gbps = specs[i]
        uuid = f"{name}-{i}"
        used = rng.choice([0, 0, 0, 8, 16, 24, 40, vram]) * GiB + rng.choice([0, 0, 777]) * MiB
        used = min(used, vram * GiB)
        peers = [f"{name}-{j}" for j in order if j != i and specs[j] == specs[i]]
        devices.append(pb.Device(
            uuid=uuid, vendor=vendor, model=model, index=indexes[i], vram_bytes=vram * GiB,
            tflops_fp16=tflops, health_score=rng.choice([100, 100, 90, 70, 50]),
            health_state=rng.choice(STATES), vram_allocated_bytes=used,
            links=[pb.Link(peer_uuid=p, kind=kind, gbps=gbps)
                   for p in peers if rng.random() < 0.8],
        ))  # fmt: skip
        if used:
            allocations.append(pb.Allocation(
                container_id=f"{uuid}-c{position}", container_name="main", source="assignment",
                pod=pb.PodRef(namespace="team", name="x", uid=f"{uuid}-pod"),
                grants=[pb.Grant(device_uuid=uuid, vram_bytes=used)]))  # fmt: skip
    key_ids = rng.choice([None, None, ["k"], ["k", "old"], ["old"]])
    obj = compute_node(name, node_spec(pb.Node(name=name, version="0.1.0"), devices))
    obj["status"] = node_status(
        devices, allocations, previous={}, now="2026-01-01T00:00:00Z", key_ids=key_ids
    )
    if rng.random() < 0.3:  # listed as a hand-written ComputeNode might list them
        rng.shuffle(obj["spec"]["devices"])
    obj["metadata"]["resourceVersion"] = str(version)
    return obj


def put(extender: Extender, name: str, rng: random.Random, version: int = 1) -> None:
    extender.state.nodes.apply(name, node_view(random_node(name, rng, version)))
    roll = rng.random()
    if roll < 0.85:
        beat(extender, name)
    elif roll < 0.95:
        beat(extender, name, age=100.0, duration=40.0)  # stale


def reference(snapshot: Snapshot, limits: dict[str, str], annotations: dict[str, str],
              name: str, signing: str, extender: Extender, used: Amounts) -> Answer:  # fmt: skip
    """What the allocator (through `planner.plan`) says of the pod on the node; a quota
    refuses first the pod's floor anywhere, then a fitting node's grants."""
    demand = extender.decider.demand(pod(limits, annotations=annotations))
    assert demand is not None
    quotas = snapshot.quotas_in(demand.namespace)
    refusal = over_quota(quotas, used, floor_of(demand))
    if refusal is not None:
        return 0, refusal, NOTHING
    why = unusable(snapshot, name, time.monotonic())
    if why is not None:
        return 0, why, NOTHING
    node = snapshot.nodes[name]
    found = plan(demand, node.view.devices, node.usage, DB)
    if isinstance(found, Unfit):
        return 0, found.reason, NOTHING
    missing = lacks_key(node.view, signing)
    if missing is not None:
        return 0, missing, NOTHING
    refusal = over_quota(quotas, used, plan_amounts(found))
    if refusal is not None:
        return 0, refusal, NOTHING
    return found.score, "", plan_amounts(found)


def aged(answer: Answer) -> Answer:
    """The answer with a stale heartbeat's age left out (the clock moves while we compare)."""
    return answer[0], re.sub(r"is \d+s old", "is Ns old", answer[1]), answer[2]


def check(extender: Extender, names: list[str], signing: str, uid: str,
          undecided: list[str]) -> int:  # fmt: skip
    """Every demand: the filter's and prioritize's answers against the reference; returns how
    many (node, demand) pairs passed, so the caller can see the fleet is not all refusals."""
    fits = 0
    for case, (limits, hints) in DEMANDS.items():
        body = pod(limits, annotations=hints, uid=f"{uid}-{case}")
        used = extender.state.namespace_usage("ns", skip_uid=f"{uid}-{case}")
        answer = extender.filter(body, names)
        # Nodes the bulk path left undecided: only those its rows cannot hold.
        snapshot = extender.state.snapshot()
        wide = {n for n in undecided if len(snapshot.nodes[n].view.devices) > WIDTH}
        assert set(undecided) == wide, (case, sorted(set(undecided) - wide))
        undecided.clear()
        scores = dict(extender.prioritize(body, list(answer.passed)))
        demand = extender.decider.demand(body)
        assert demand is not None
        demand_id = extender.decider.demand_id(demand)
        now = time.monotonic()
        for name in names:
            expected = reference(snapshot, limits, hints, name, signing, extender, used)
            if name in answer.failed:
                got: Answer = (0, answer.failed[name], NOTHING)
            else:
                assert name in answer.passed, (case, name)
                # The amounts the fast path counts: the floor on the bulk path (what quotas
                # are checked against), else the node-by-node answer's.
                amounts = (
                    floor_of(demand)
                    if one_slice(demand) is not None
                    else extender.decider.answer(snapshot, demand, demand_id, name, now)[2]
                )
                got = (scores[name], "", amounts)
                fits += 1
            assert aged(got) == aged(expected), (case, name, snapshot.nodes.get(name))
            # The node-by-node answer (a verdict's refresh) before the key and quota checks.
            alone = extender.decider.answer(snapshot, demand, demand_id, name, now)
            if not expected[1].startswith(("node does not hold the signing key", "ComputeQuota")):
                assert aged(alone) == aged(expected), (case, name, snapshot.nodes.get(name))
    return fits


QUOTAS = {  # the namespace holds 12 devices, 96 GiB and no reserved compute to begin with
    "no-quota": None,
    "vram-quota": {"vram": "100Gi"},
    "tflops-devices-quota": {"tflops-fp16": "500", "devices": "14"},
}


@pytest.mark.parametrize(
    ("seed", "quota"),
    [(1, "no-quota"), (2, "no-quota"), (3, "no-quota"), (4, "vram-quota"),
     (5, "tflops-devices-quota")],
)  # fmt: skip
def test_the_fast_paths_answer_what_the_allocator_answers(seed: int, quota: str) -> None:
    rng = random.Random(seed)
    signing = rng.choice(["k", "k", ""])
    # No signing key ("") in use: no node is refused for lacking one.
    extender = Extender(Kube.__new__(Kube), lambda: Keyring({"k": b"k" * 32}, signing), DB)
    with_profiles(extender)
    hard = QUOTAS[quota]
    if hard is not None:
        obj = {"metadata": {"namespace": "ns", "name": "q"}, "spec": {"hard": hard}}
        extender.state.quotas.apply("ns/q", quota_of(obj))
    undecided: list[str] = []  # what the bulk path handed to the node-by-node decision
    judge = extender.decider._bulk.judge

    def watched(*args: Any, **kwargs: Any) -> BulkVerdict:
        found = judge(*args, **kwargs)
        undecided.extend(found.undecided)
        return found

    extender.decider._bulk.judge = watched  # type: ignore[method-assign]
    names = [f"node-{i:03d}" for i in range(160)]
    for name in names:
        put(extender, name, rng)
    for i, name in enumerate(names[:12]):  # usage from pods the pods informer shows
        extender.state.pods.apply(f"team/p{i}", assigned(f"p{i}", name, (0, 8)))
    asked = [*names, "no-such-node"]
    rng.shuffle(asked)
    first = check(extender, asked, signing, "a", undecided)
    assert first > 0  # the fleet is not all refusals
    # Churn: nodes change, go and come back (rows reused), holds move; again, twice (the
    # second time the verdicts are patched, not decided afresh).
    for round_ in range(2):
        for name in rng.sample(names, 40):
            put(extender, name, rng, version=2 + round_)
        for name in rng.sample(names, 5):
            extender.state.nodes.apply(name, None)
        for name in rng.sample(names, 5):
            put(extender, name, rng, version=4 + round_)
        extender.state.assume(f"q{round_}", names[20], assigned("q", names[20], (1, 4)).holds)
        check(extender, asked, signing, "a", undecided)
        check(extender, asked, signing, f"b{round_}", undecided)


def test_an_empty_fleet_refuses_every_name_for_its_missing_computenode() -> None:
    extender = Extender(Kube.__new__(Kube), lambda: Keyring({"k": b"k" * 32}, "k"), DB)
    answer = extender.filter(pod({"ai.compute/vram": "1Gi"}), ["a", "b"])
    assert not answer.passed
    assert set(answer.failed) == {"a", "b"}
    assert all("has no ComputeNode" in reason for reason in answer.failed.values())
