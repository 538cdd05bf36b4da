"""The extender's cluster state and decisions: snapshots, heartbeats, holds, the caches, and
filters running while the informers change the state under them."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from hcsd.cluster.binding import signed_assignment
from hcsd.cluster.compute_quota import Amounts, quota_of
from hcsd.cluster.decisions import Decider
from hcsd.cluster.demand import demand_of
from hcsd.cluster.extender import Extender
from hcsd.cluster.extender_metrics import Metrics
from hcsd.cluster.holds import pod_info
from hcsd.cluster.kube import Kube
from hcsd.cluster.objects import node_view
from hcsd.cluster.state import ClusterState
from hcsd.contract.assignment import Assignment, encode
from hcsd.contract.keyring import Keyring, node_key
from hcsd.model import Grant
from hcsd.profiles.database import ProfileDatabase
from tests.unit.fleet import GiB, add_node, assigned, beat, node_object, pod
from tests.unit.watchserver import WatchServer

DB = ProfileDatabase.load(None)


def KEYS() -> Keyring:
    return Keyring({"k": b"k" * 32}, "k")


def new_extender() -> Extender:
    return Extender(Kube.__new__(Kube), KEYS, DB)


def passed(extender: Extender, limits: dict[str, str], names: list[str], **kw: Any) -> list[str]:
    return list(extender.filter(pod(limits, **kw), names).passed)


def failed(extender: Extender, limits: dict[str, str], names: list[str]) -> dict[str, str]:
    return dict(extender.filter(pod(limits), names).failed)


def decided(extender: Extender, limits: dict[str, str], names: list[str], uid: str) -> Any:
    """Filter then prioritize, as kube-scheduler asks: passed, failed and scores, in order of
    name (a patched verdict lists nodes that came to pass last)."""
    answer = extender.filter(pod(limits, uid=uid), names)
    scores = extender.prioritize(pod(limits, uid=uid), sorted(answer.passed))
    return sorted(answer.passed), dict(answer.failed), scores


def test_a_snapshot_stays_as_it_was_taken() -> None:
    e = new_extender()
    add_node(e, "a")
    beat(e, "a")
    first = e.state.snapshot()
    assert e.state.snapshot() is first  # nothing changed: the same object, no work
    node_a = first.nodes["a"]
    add_node(e, "a", allocated={0: ("p", 80)}, version=2)
    add_node(e, "b")
    beat(e, "b")
    e.state.quotas.apply("ns/q", quota_of({"metadata": {"name": "q", "namespace": "ns"},
                                           "spec": {"hard": {"devices": 1}}}))  # fmt: skip
    assert first.nodes["a"] is node_a and set(first.nodes) == {"a"}
    assert set(first.heartbeats) == {"a"} and first.quotas == ()
    second = e.state.snapshot()
    assert second.version > first.version and set(second.nodes) == {"a", "b"}
    assert second.nodes["a"].usage["a-0"].vram_bytes == 80 * GiB
    assert [q.name for q in second.quotas] == ["q"]
    assert e.state.changed_between(first.version, second.version) == {"a", "b"}


def test_a_renewal_counts_from_when_it_is_seen_not_from_its_stamp() -> None:
    e = new_extender()
    add_node(e, "n")
    beat(e, "n", age=100)  # first sight: only the stamp tells
    assert failed(e, {"ai.compute/vram": "1Gi"}, ["n"])["n"].startswith(
        "hcs heartbeat is 100s old (limit 40s)"
    )
    # The syncer's clock is 1,000 s behind ours: a new stamp is a renewal seen now all the same.
    beat(e, "n", age=1000)
    assert passed(e, {"ai.compute/vram": "1Gi"}, ["n"]) == ["n"]
    # A deleted Lease leaves the last heartbeat to age out, as a silent syncer would.
    e.state.leases.apply("hcs-system/hcs-node-n", None)
    assert passed(e, {"ai.compute/vram": "1Gi"}, ["n"]) == ["n"]


def test_a_heartbeat_expiring_or_coming_back_is_seen_through_a_cached_verdict() -> None:
    e = new_extender()
    for name in ("a", "b"):
        add_node(e, name)
    beat(e, "a", age=39.7)
    beat(e, "b", age=100)
    names = ["a", "b"]
    assert passed(e, {"ai.compute/vram": "8Gi"}, names) == ["a"]
    time.sleep(0.4)  # a's heartbeat expires: the verdict was valid until then
    answer = e.filter(pod({"ai.compute/vram": "8Gi"}), names)
    assert list(answer.passed) == [] and "hcs heartbeat is 40s old" in answer.failed["a"]
    beat(e, "b")  # b comes back to life: its cached "stale" answer must go
    assert passed(e, {"ai.compute/vram": "8Gi"}, names) == ["b"]


def test_holds_count_once_and_go_when_the_pod_goes() -> None:
    e = new_extender()
    add_node(e, "n", count=1)
    beat(e, "n")
    e.state.pods.apply("ns/p1", assigned("p1", "n", (0, 60)))
    assert failed(e, {"ai.compute/vram": "30Gi"}, ["n"])["n"] == (
        "container main: A100-SXM4-80GB: 30Gi wanted, most free is 20Gi on A100-SXM4-80GB#0"
    )
    # hcsd allocated it and the syncer says so: the same grant, counted from the status only.
    add_node(e, "n", count=1, allocated={0: ("p1", 60)}, version=2)
    assert passed(e, {"ai.compute/vram": "20Gi"}, ["n"], uid="u2") == ["n"]
    e.state.pods.apply("ns/p1", None)  # deleted (or Succeeded): the informer drops it
    add_node(e, "n", count=1, version=3)  # and hcsd releases it
    assert passed(e, {"ai.compute/vram": "80Gi"}, ["n"], uid="u3") == ["n"]
    assert e.state.counts() == (1, 0)


def test_namespace_usage_counts_grants_in_the_namespace_but_the_pod_decided() -> None:
    e = new_extender()
    add_node(e, "n", count=2)
    e.state.pods.apply("ns/p1", assigned("p1", "n", (0, 10)))
    e.state.pods.apply("ns/p2", assigned("p2", "n", (1, 20)))
    e.state.pods.apply("other/p3", assigned("p3", "n", (1, 5), namespace="other"))
    assert e.state.namespace_usage("ns") == Amounts(30 * GiB, 0.0, 2)
    assert e.state.namespace_usage("ns", skip_uid="p2") == Amounts(10 * GiB, 0.0, 1)
    token = e.state.assume("p4", "n", assigned("p4", "n", (0, 1)).holds)  # a bind not seen yet
    assert token is not None
    assert e.state.namespace_usage("ns").devices == 3
    e.state.forget("p4", token)  # its Binding failed
    assert e.state.namespace_usage("ns").devices == 2


def test_a_changed_node_is_the_only_one_decided_again() -> None:
    e = new_extender()
    names = [f"n{i}" for i in range(20)]
    for name in names:
        add_node(e, name)
        beat(e, name)
    assert len(passed(e, {"ai.compute/vram": "16Gi"}, names)) == 20
    before = e.state.snapshot()
    # A one-slice demand is decided for all nodes at once (bulk.py): no per-node memo.
    assert all(not node.answers for node in before.nodes.values())
    add_node(e, "n3", allocated={0: ("x", 80), 1: ("y", 80)}, version=2)
    answer = decided(e, {"ai.compute/vram": "16Gi"}, names, "u2")
    after = e.state.snapshot()
    assert [n for n in names if after.nodes[n] is not before.nodes[n]] == ["n3"]
    # The verdict's refresh decided n3 alone, node by node (its answer memo).
    assert [n for n in names if after.nodes[n].answers] == ["n3"]
    assert "n3" in answer[1] and len(answer[0]) == 19
    (verdict,) = e.decider._verdicts.values()  # one demand, one node list: one verdict
    assert verdict.version == after.version
    # The patched verdict is what a cold extender decides from the same objects.
    cold = new_extender()
    for name in names:
        add_node(
            cold, name, **({"allocated": {0: ("x", 80), 1: ("y", 80)}} if name == "n3" else {})
        )
        beat(cold, name)
    assert decided(cold, {"ai.compute/vram": "16Gi"}, names, "u2") == answer


def test_racing_threads_never_share_a_demand_id() -> None:
    decider = Decider(DB, Metrics(), lambda a, b: set())
    demands = [demand_of(pod({"ai.compute/vram": f"{i + 1}Mi"})) for i in range(4000)]
    ids: list[list[int]] = [[], [], [], []]

    def work(k: int) -> None:
        for demand in demands[k::4] + demands:
            assert demand is not None
            ids[k].append(decider.demand_id(demand))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({decider.demand_id(d) for d in demands if d is not None}) == len(demands)


DEMANDS = [
    {"ai.compute/vram": "16Gi"},
    {"ai.compute/vram": "50Gi"},
    {"ai.compute/devices": "2"},
    {"ai.compute/tflops-fp16": "400"},
]


def fleet_object(name: str, rng: random.Random, version: int) -> dict[str, Any]:
    allocated = {
        i: (f"{name}-{i}", rng.choice([8, 40, 72])) for i in range(4) if rng.random() < 0.4
    }
    return node_object(name, count=4, allocated=allocated, version=version)


@pytest.mark.parametrize("seed", [1, 2])
def test_filters_racing_informer_updates_end_where_a_cold_start_does(seed: int) -> None:
    """Four threads filter while the informers change nodes, heartbeats and pods under them;
    once the changes stop, every cached verdict equals what a fresh extender decides."""
    rng = random.Random(seed)
    e = new_extender()
    names = [f"n{i:03d}" for i in range(120)]
    objects = {name: fleet_object(name, rng, 1) for name in names}
    for name in names:
        e.state.nodes.apply(name, node_view(objects[name]))
        beat(e, name)
    stop = threading.Event()
    errors: list[BaseException] = []

    def filtering(k: int) -> None:
        local = random.Random(k)
        try:
            while not stop.is_set():
                limits = local.choice(DEMANDS)
                answer = e.filter(pod(limits, uid=f"t{k}"), names)
                assert len(answer.passed) + len(answer.failed) == len(names)
                e.prioritize(pod(limits, uid=f"t{k}"), list(answer.passed))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=filtering, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    pods: dict[str, str] = {}
    for step in range(1500):
        name = rng.choice(names)
        roll = rng.random()
        if roll < 0.6:
            objects[name] = fleet_object(name, rng, step + 2)
            e.state.nodes.apply(name, node_view(objects[name]))
        elif roll < 0.8:
            uid = f"pod-{step}"
            pods[uid] = name
            e.state.pods.apply(f"ns/{uid}", assigned(uid, name, (rng.randrange(4), 4)))
        elif roll < 0.9 and pods:
            uid = rng.choice(sorted(pods))
            e.state.pods.apply(f"ns/{uid}", None)
            del pods[uid]
        else:
            beat(e, name)
        if step % 100 == 0:
            time.sleep(0.001)  # let the filters see states in between
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    cold = new_extender()
    for name in names:
        cold.state.nodes.apply(name, node_view(objects[name]))
        beat(cold, name)
    for uid, name in pods.items():
        cold.state.pods.apply(f"ns/{uid}", e.state.pods.items[f"ns/{uid}"])
    for limits in DEMANDS:
        assert decided(e, limits, names, "final") == decided(cold, limits, names, "final")


def test_an_assumed_pod_that_a_later_full_list_does_not_show_is_forgotten() -> None:
    """The assume cache's expiry. A pod bound here and deleted before the pods informer saw it
    (its watch broke in between, so neither event came) would otherwise hold its grants until
    the extender restarts; the informer's next full list settles it."""
    server = WatchServer(path="/api/v1/pods")
    state = ClusterState(server.kube(), keys=KEYS)
    try:
        state.nodes.apply("n", node_view(node_object("n")))
        tokens = {}
        for uid, gib in (("gone", 1), ("in-flight", 2), ("listed", 4)):
            held = assigned(uid, "n", (0, gib), namespace="test").holds
            tokens[uid] = state.assume(uid, "n", held) or 0
        state.bound("gone", tokens["gone"])  # then deleted, unseen
        state.bound("listed", tokens["listed"])  # and still there:
        grants = {"main": (Grant("n-0", 4 * GiB, 0),)}
        annotation = signed_assignment("n", "listed", grants, KEYS(), int(time.time()))
        meta = {"uid": "listed", "annotations": {"hcs.io/assignment": annotation}}
        server.put("listed", meta=meta, spec={"nodeName": "n"}, status={"phase": "Running"})
        state.pods.start()
        assert state.pods.synced.wait(10)
        # "in-flight" has no answer to its Binding yet: the list may predate it, so it stays.
        assert state.namespace_usage("test").vram == 6 * GiB
        state.bound(
            "in-flight", tokens["in-flight"]
        )  # written now, but the pod is gone before anyone saw it
        server.change_unseen({}, [])  # the watch breaks: the informer lists again
        deadline = time.monotonic() + 10
        while state.namespace_usage("test").vram != 4 * GiB and time.monotonic() < deadline:
            time.sleep(0.01)
        assert state.namespace_usage("test").vram == 4 * GiB
        assert state.snapshot().nodes["n"].usage["n-0"].vram_bytes == 4 * GiB
    finally:
        state.stop()
        server.close()


def _pod_with(annotation: str, *, uid: str = "u1", node: str = "n", phase: str = "Running") -> dict:
    return {
        "metadata": {"uid": uid, "namespace": "ns", "name": "p",
                     "annotations": {"hcs.io/assignment": annotation}},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }  # fmt: skip


GRANTS = {"main": (Grant("n-0", 4 * GiB, 0),)}
SIGNED = signed_assignment("n", "u1", GRANTS, KEYS(), int(time.time()))
OLD = Keyring({"old": b"o" * 32}, "old")
RETIRED = signed_assignment("n", "u1", GRANTS, OLD, int(time.time()))
REMOVED = signed_assignment("n", "u1", GRANTS, Keyring({"gone": b"g" * 32}, "gone"), 0)


def ROTATED() -> Keyring:
    """After a rotation: signing with "k", "old" retired (kept for running pods)."""
    return Keyring({"k": b"k" * 32, "old": b"o" * 32}, "k", retired=frozenset({"old"}))


@pytest.mark.parametrize(
    ("pod", "counts"),
    [
        (_pod_with(SIGNED), True),
        (_pod_with(SIGNED, phase="Succeeded"), False),
        (_pod_with(SIGNED, node=""), False),  # not bound (the annotation came some other way)
        (_pod_with(SIGNED, uid="u2"), False),  # copied to another pod
        (_pod_with(SIGNED, node="m"), False),  # a pod bound elsewhere
        (
            _pod_with(signed_assignment("n", "u1", GRANTS, Keyring({"k": b"x" * 32}, "k"), 0)),
            False,
        ),  # forged
        (_pod_with('{"v": 1}'), False),
        (_pod_with(RETIRED), True),  # signed with a key since retired: it still holds
        (_pod_with(REMOVED), False),  # signed with a key the Secret no longer has
    ],
    ids=[
        "signed",
        "ended",
        "unbound",
        "copied",
        "other-node",
        "other-key",
        "malformed",
        "retired-key",
        "removed-key",
    ],
)
def test_only_bound_pods_whose_assignment_verifies_hold_anything(pod: dict, counts: bool) -> None:
    """An annotation anyone who can update the pod may write: what it claims neither fills a
    node nor counts in a quota unless the extender's key signed it for this pod and node."""
    try:
        info = pod_info(pod, ROTATED)
    except ValueError as e:  # the informer logs it and keeps the pod out
        assert not counts, e
        return
    assert (info is not None) == counts
    if info is not None:
        assert [h.grants for h in info.holds] == [GRANTS["main"]]


def UPGRADED() -> Keyring:
    """The Secret of earlier releases (`assignment.key`) after rotation step 2."""
    return Keyring({"assignment": b"a" * 32, "k": b"k" * 32}, "k")


@pytest.mark.parametrize(
    ("annotation", "counts"),
    [
        pytest.param(encode(Assignment("n", "u1", 0, GRANTS), b"a" * 32), True, id="v1-old-key"),
        pytest.param(encode(Assignment("n", "u1", 0, GRANTS), b"x" * 32), False, id="v1-forged"),
        pytest.param(
            encode(Assignment("n", "u1", 0, GRANTS), node_key(b"a" * 32, "n")),
            False,
            id="v1-derived-key",
        ),
    ],
)
def test_pods_bound_before_the_upgrade_keep_counting(annotation: str, counts: bool) -> None:
    """Version-1 assignments were signed with the one cluster key as it is, not derived."""
    try:
        info = pod_info(_pod_with(annotation), UPGRADED)
    except ValueError as e:
        assert not counts, e
        return
    assert info is not None and counts
    assert [h.grants for h in info.holds] == [GRANTS["main"]]


def test_a_node_that_lacks_the_signing_key_is_filtered_out_with_the_reason() -> None:
    """A rotation step taken before every node fetched the key: the pod stays Pending (or
    goes elsewhere) rather than have its containers refused on the node."""
    keys = [Keyring({"k": b"k" * 32}, "k")]
    e = Extender(Kube.__new__(Kube), lambda: keys[0], DB)
    add_node(e, "has-k", key_ids=["k"])
    add_node(e, "behind", key_ids=["old"])
    add_node(e, "no-keys", key_ids=[])
    add_node(e, "older-syncer")  # reports no key ids: not held against it
    names = ["has-k", "behind", "no-keys", "older-syncer"]
    for name in names:
        beat(e, name)
    limits = {"ai.compute/vram": "1Gi"}
    assert sorted(passed(e, limits, names)) == ["has-k", "older-syncer"]
    reasons = failed(e, limits, names)
    assert set(reasons) == {"behind", "no-keys"}
    assert reasons["behind"].startswith("node does not hold the signing key k yet")
    keys[0] = Keyring({"k": b"k" * 32, "old": b"o" * 32}, "old")  # the Secret moves signing
    assert sorted(passed(e, limits, names)) == ["behind", "older-syncer"]  # not a stale verdict
