"""The requeue worker's choices: which refused pods it touches, when, and how many
(tests/cluster/test_requeue.py has kube-scheduler's side)."""

from __future__ import annotations

import re
from typing import Any

from prometheus_client import CollectorRegistry

from hcsd.cluster.compute_quota import quota_of
from hcsd.cluster.extender import Extender
from hcsd.cluster.kube import Kube, KubeError
from hcsd.cluster.requeue import Requeuer
from hcsd.contract.keyring import Keyring
from hcsd.contract.names import ANNOTATION_CAPACITY_FREED
from hcsd.profiles.database import ProfileDatabase
from tests.unit.fleet import add_node, assigned, beat, pod

DB = ProfileDatabase.load(None)
FULL = {0: ("a", 80), 1: ("b", 80)}  # both A100s of a node taken whole


class Patches(Kube):
    """The API server's side of a touch: records each PATCH; `refuse` answers some with an
    error status."""

    def __init__(self) -> None:  # no connection: nothing else is called
        self.sent: list[tuple[str, str]] = []  # (pod name, node in the annotation)
        self.refuse: dict[str, tuple[int, str]] = {}  # pod name: (status, message)

    def patch(self, path: str, body: Any) -> dict[str, Any]:
        name = path.rsplit("/", 1)[1]
        if name in self.refuse:
            status, message = self.refuse[name]
            raise KubeError(status, "Refused", message)
        self.sent.append((name, body["metadata"]["annotations"][ANNOTATION_CAPACITY_FREED]))
        return {}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def setup(keys: Keyring | None = None, **kwargs: Any) -> tuple[Extender, Requeuer, Patches, Clock]:
    ring = keys or Keyring({"k": b"k" * 32}, "k")
    e = Extender(Kube.__new__(Kube), lambda: ring, DB)
    kube, clock = Patches(), Clock()
    e.requeue = Requeuer(
        kube, e.state, e.decider, lambda: ring.signing, CollectorRegistry(), clock=clock, **kwargs
    )
    return e, e.requeue, kube, clock


def refuse(e: Extender, uid: str, gib: int, names: list[str]) -> None:
    """kube-scheduler's filter call, refused on every node."""
    answer = e.filter(pod({"ai.compute/vram": f"{gib}Gi"}, uid=uid), names)
    assert not answer.passed, answer


def touched(kube: Patches) -> list[str]:
    found = [name for name, _ in kube.sent]
    kube.sent.clear()
    return found


def test_a_refused_pod_is_touched_once_when_its_node_frees_and_a_misfit_never() -> None:
    e, requeue, kube, clock = setup()
    add_node(e, "n", allocated=FULL)
    beat(e, "n")
    refuse(e, "fits-later", 40, ["n"])
    refuse(e, "never", 200, ["n"])  # more than an A100 has
    assert requeue.step() == 0  # nothing changed since the refusals
    add_node(e, "n", allocated={0: ("a", 80)}, version=2)  # one device freed
    assert requeue.step() == 1
    ((name, annotation),) = kube.sent
    # Only the time: which node made room is not the pod's tenant's business.
    assert name == "fits-later" and re.fullmatch(r"20\d\d-\d\d-\d\dT[\d:]{8}\.\d{3}Z", annotation)
    kube.sent.clear()
    assert requeue.step() == 0  # no change: no touch, whatever is remembered
    for version in range(3, 8):  # the node keeps changing
        clock.now += 60
        add_node(e, "n", allocated={0: ("a", 80), 1: ("b", 10 * version)}, version=version)
        requeue.step()
    assert "never" not in touched(kube)


def test_only_nodes_kube_scheduler_offered_count() -> None:
    e, requeue, kube, _ = setup()
    for name in ("offered", "elsewhere"):
        add_node(e, name, allocated=FULL)
        beat(e, name)
    refuse(e, "p", 40, ["offered"])
    requeue.step()
    add_node(e, "elsewhere", version=2)  # frees, but kube-scheduler did not offer it
    assert requeue.step() == 0
    add_node(e, "offered", version=2)
    assert requeue.step() == 1 and touched(kube) == ["p"]


def test_a_node_that_frees_wakes_a_few_pods_at_a_time_by_priority() -> None:
    e, requeue, kube, _ = setup(per_node=4)
    add_node(e, "n", allocated=FULL)
    beat(e, "n")
    for i in range(10):
        refuse(e, f"p{i}", 10, ["n"])
    requeue.step()
    add_node(e, "n", version=2)
    assert requeue.step() == 4
    assert touched(kube) == ["p0", "p1", "p2", "p3"]  # the oldest refusals first
    add_node(e, "n", allocated={0: ("p0", 10)}, version=3)  # one bound: the node changes
    assert touched(kube) == [] and requeue.step() == 4
    assert touched(kube) == ["p4", "p5", "p6", "p7"]


def test_a_pod_touched_and_refused_again_waits_its_backoff() -> None:
    e, requeue, kube, clock = setup()
    add_node(e, "n", allocated=FULL)
    beat(e, "n")
    refuse(e, "p", 40, ["n"])
    requeue.step()
    add_node(e, "n", version=2)
    assert requeue.step() == 1
    add_node(e, "n", allocated=FULL, version=3)  # another pod took it first
    refuse(e, "p", 40, ["n"])
    add_node(e, "n", version=4)  # and freed it again at once
    assert requeue.step() == 0  # 1 s back-off after the first touch
    clock.now += 1.1
    assert requeue.step() == 1  # what freed during the back-off is not lost
    assert touched(kube) == ["p", "p"]


def test_touches_are_rate_limited_and_the_rest_follow() -> None:
    e, requeue, kube, clock = setup(rate=2.0)
    for i in range(4):
        add_node(e, f"n{i}", allocated=FULL)
        beat(e, f"n{i}")
    names = [f"n{i}" for i in range(4)]
    for i in range(4):
        refuse(e, f"p{i}", 10, names)
    requeue.step()
    for i in range(4):
        add_node(e, f"n{i}", version=2)
    assert requeue.step() == 2
    assert requeue.step() == 0  # no token left yet
    clock.now += 1.0
    assert requeue.step() == 2
    assert sorted(touched(kube)) == ["p0", "p1", "p2", "p3"]


def test_a_pod_bound_or_gone_meanwhile_is_forgotten_and_the_next_one_woken() -> None:
    e, requeue, kube, _ = setup(per_node=1)
    add_node(e, "n", allocated=FULL)
    beat(e, "n")
    refuse(e, "gone", 10, ["n"])
    refuse(e, "next", 10, ["n"])
    requeue.step()
    bound = "hcs-scheduler-extender may touch only pods that are not bound yet"
    kube.refuse["gone"] = (403, bound)  # admission-requeue.yaml: bound meanwhile
    add_node(e, "n", version=2)
    assert requeue.step() == 0
    assert requeue.remembered() == ["next"]
    assert requeue.step() == 1 and touched(kube) == ["next"]  # the node is looked at again


def test_a_pod_that_passes_a_filter_is_forgotten_and_old_refusals_expire() -> None:
    e, requeue, _, clock = setup()
    add_node(e, "n", allocated=FULL)
    beat(e, "n")
    refuse(e, "p", 10, ["n"])
    refuse(e, "q", 10, ["n"])
    add_node(e, "n", version=2)
    e.filter(pod({"ai.compute/vram": "10Gi"}, uid="p"), ["n"])  # kube-scheduler's own retry
    assert requeue.remembered() == ["q"]
    clock.now += 331  # its 5-minute flush has retried it since
    add_node(e, "n", allocated=FULL, version=3)
    requeue.step()
    assert requeue.remembered() == []


def test_a_node_fetching_the_signing_key_wakes_the_pods_refused_for_it() -> None:
    e, requeue, kube, _ = setup(keys=Keyring({"k": b"k" * 32, "k2": b"2" * 32}, "k2"))
    add_node(e, "n", key_ids=["k"])
    beat(e, "n")
    refuse(e, "p", 10, ["n"])
    requeue.step()
    add_node(e, "n", key_ids=["k"], version=2)  # a change that still lacks the key
    assert requeue.step() == 0
    add_node(e, "n", key_ids=["k", "k2"], version=3)
    assert requeue.step() == 1 and touched(kube) == ["p"]


def test_a_failed_touch_is_retried_on_the_next_change_only() -> None:
    e, requeue, kube, clock = setup()
    add_node(e, "n", allocated=FULL)
    beat(e, "n")
    refuse(e, "p", 10, ["n"])
    requeue.step()
    kube.refuse["p"] = (500, "etcdserver: request timed out")
    add_node(e, "n", version=2)
    assert requeue.step() == 0
    del kube.refuse["p"]
    assert requeue.step() == 0  # nothing changed; its back-off runs
    clock.now += 1.1
    add_node(e, "n", version=3)
    assert requeue.step() == 1


def quota(vram: str) -> Any:
    return quota_of(
        {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"hard": {"vram": vram}}}
    )


def test_a_pod_over_its_quota_is_touched_when_the_namespace_frees_or_the_quota_grows() -> None:
    """The quota refused it everywhere: its node may be one that did not change."""
    e, requeue, kube, clock = setup()
    for name in ("quiet", "busy"):
        add_node(e, name)
        beat(e, name)
    e.state.quotas.apply("ns/q", quota("20Gi"))
    e.state.pods.apply("ns/holder", assigned("holder", "busy", (0, 16)))
    refuse(e, "p", 10, ["quiet", "busy"])  # 16 + 10 > 20
    requeue.step()
    add_node(e, "busy", version=2)  # a change that leaves the namespace's usage as it was
    assert requeue.step() == 0
    e.state.pods.apply("ns/holder", None)  # the namespace frees 16Gi on busy
    assert requeue.step() == 1 and touched(kube) == ["p"]
    refuse(e, "q", 30, ["quiet", "busy"])  # over 20Gi whatever the namespace holds
    requeue.step()
    clock.now += 2
    e.state.quotas.apply("ns/q", quota("40Gi"))  # the limit grows: no node changes
    assert requeue.step() == 1 and touched(kube) == ["q"]


def test_a_refusal_that_arrives_while_the_touch_is_in_flight_is_kept() -> None:
    """kube-scheduler can see the touch and refuse the pod again before the PATCH answers:
    that refusal must stand, or the pod is never touched again."""
    e, requeue, kube, clock = setup()
    add_node(e, "n", allocated=FULL)
    beat(e, "n")
    refuse(e, "p", 40, ["n"])
    requeue.step()
    answer = kube.patch

    def patch(path: str, body: Any) -> dict[str, Any]:
        out = answer(path, body)
        add_node(e, "n", allocated=FULL, version=99)  # another pod took the room
        refuse(e, "p", 40, ["n"])
        return out

    kube.patch = patch  # type: ignore[method-assign]
    add_node(e, "n", version=2)
    assert requeue.step() == 1
    kube.patch = answer  # type: ignore[method-assign]
    assert touched(kube) == ["p"]
    clock.now += 60  # past the back-off
    add_node(e, "n", version=100)  # room frees again
    assert requeue.step() == 1
    assert touched(kube) == ["p"]


def test_a_denied_touch_is_counted_apart_from_a_gone_pod(caplog: Any) -> None:
    """404/409, the uid precondition's 422 and the policy's 'bound' 403 mean the pod is
    gone; any other 403/422 is a denial someone should see (the policy or RBAC changed)."""
    e, requeue, kube, _ = setup()
    add_node(e, "n", allocated=FULL)
    beat(e, "n")
    answers = {
        "deleted": (404, "not found"),
        "replaced": (422, 'Pod "replaced" is invalid: metadata.uid: field is immutable'),
        "denied": (403, 'pods "denied" is forbidden: User cannot patch resource "pods"'),
        "invalid": (422, "ValidatingAdmissionPolicy 'x' denied request"),
    }
    for name, answer in answers.items():
        refuse(e, name, 10, ["n"])
        kube.refuse[name] = answer
    requeue.step()
    add_node(e, "n", version=2)
    with caplog.at_level("WARNING"):
        requeue.step()
    counted = {r: requeue.touches.labels(r)._value.get() for r in ("gone", "denied")}
    assert counted == {"gone": 2, "denied": 2}
    warned = [r.getMessage() for r in caplog.records if "denied" in r.getMessage()]
    assert len(warned) == 1 and "forbidden" in warned[0]  # once a minute, the server's words


def test_a_long_offer_counts_as_any_node_in_a_mixed_cluster() -> None:
    """400 ComputeNodes among 5,000 Nodes: kube-scheduler stopped at 500 feasible Nodes, 40
    of them HCS nodes. Fewer offered names than ComputeNodes says nothing about cutting short;
    100 or more offered names mean it may have stopped looking."""
    e, requeue, kube, _ = setup()
    hcs = [f"g{i}" for i in range(400)]
    for n in hcs:
        add_node(e, n, allocated=FULL)
        beat(e, n)
    refuse(e, "p", 40, [f"cpu{i}" for i in range(460)] + hcs[:40])
    requeue.step()
    add_node(e, "g300", version=2)  # frees, outside what was offered
    assert requeue.step() == 1 and touched(kube) == ["p"]


def test_a_step_spends_its_budget_and_the_pods_left_follow_in_the_next_steps() -> None:
    """With no time to spare a step decides one pod; the others, not reached, are asked about
    what changed since their last look in the next steps, so nothing they missed is lost."""
    e, requeue, kube, _ = setup(budget=0.0)
    for n in ("a", "b", "c"):
        add_node(e, n, allocated=FULL)
        beat(e, n)
    for uid, n in (("pa", "a"), ("pb", "b"), ("pc", "c")):
        refuse(e, uid, 40, [n])
    requeue.step()
    requeue.step()
    for version, n in enumerate(("a", "b", "c"), start=2):
        add_node(e, n, version=version)
    assert [requeue.step() for _ in range(4)] == [1, 1, 1, 0]
    assert touched(kube) == ["pa", "pb", "pc"]


def test_a_pod_that_missed_changes_is_asked_about_those_nodes_only() -> None:
    """A back-off hid changes from it: the nodes changed since its last look, not the fleet."""
    e, requeue, kube, clock = setup()
    names = [f"n{i}" for i in range(50)]
    for n in names:
        add_node(e, n, allocated=FULL)
        beat(e, n)
    refuse(e, "p", 40, names)
    requeue.step()
    add_node(e, "n1", version=2)
    assert requeue.step() == 1
    add_node(e, "n1", allocated=FULL, version=3)  # taken again, the pod refused again
    refuse(e, "p", 40, names)
    add_node(e, "n2", version=4)  # frees while it backs off
    asked: list[str] = []
    answer = e.decider.answer

    def counted(snapshot: Any, demand: Any, demand_id: Any, name: str, now: float) -> Any:
        asked.append(name)
        return answer(snapshot, demand, demand_id, name, now)

    e.decider.answer = counted  # type: ignore[method-assign]
    assert requeue.step() == 0
    clock.now += 1.1
    assert requeue.step() == 1 and touched(kube) == ["p", "p"]
    assert sorted(set(asked)) == ["n1", "n2"]  # not the 48 nodes nothing happened on
