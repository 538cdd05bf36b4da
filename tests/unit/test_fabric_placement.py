"""A job's pods on one fabric domain: who is one job, which domain is the job's, the scores
prioritize gives, and what the filter refuses under `high-bandwidth`."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import Any

import pytest

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster import fabric_placement
from hcsd.cluster.binding import BindRequest, signed_assignment
from hcsd.cluster.extender import Extender
from hcsd.cluster.fabric_jobs import JobIndex, JobKey, job_of, job_size
from hcsd.cluster.fabric_placement import CHOICE_SECONDS, lift
from hcsd.cluster.holds import PodInfo, pod_info
from hcsd.cluster.http import filter_result
from hcsd.cluster.kube import Kube
from hcsd.cluster.objects import node_spec, node_view
from hcsd.contract.keyring import Keyring
from hcsd.model import Grant
from hcsd.profiles.database import ProfileDatabase
from tests.unit.fleet import assigned, beat, node_object

DB = ProfileDatabase.load(None)
GiB = 2**30
ONE = {"ai.compute/devices": "1"}
HB = {"hcs.io/topology-preference": "high-bandwidth"}


def meta(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
         namespace: str = "ns") -> dict[str, Any]:  # fmt: skip
    return {"metadata": {"namespace": namespace, "labels": labels or {},
                         "annotations": annotations or {}}}  # fmt: skip


@pytest.mark.parametrize(
    ("pod", "job"),
    [
        pytest.param(meta({"job-name": "j"}), JobKey("ns", "job", "j"), id="job-legacy"),
        pytest.param(meta({"batch.kubernetes.io/job-name": "j", "job-name": "x"}),
                     JobKey("ns", "job", "j"), id="job"),
        pytest.param(meta({"training.kubeflow.org/job-name": "t", "job-name": "t-worker"}),
                     JobKey("ns", "kubeflow", "t"), id="kubeflow-over-job"),
        pytest.param(meta({"jobset.sigs.k8s.io/jobset-name": "s", "batch.kubernetes.io/job-name":
                           "s-w-0"}), JobKey("ns", "jobset", "s"), id="jobset-over-job"),
        pytest.param(meta({"pod-group.scheduling.sigs.k8s.io": "g"}),
                     JobKey("ns", "podgroup", "g"), id="podgroup-old"),
        pytest.param(meta({"scheduling.x-k8s.io/pod-group": "g",
                           "jobset.sigs.k8s.io/jobset-name": "s"}),
                     JobKey("ns", "podgroup", "g"), id="podgroup-over-jobset"),
        pytest.param(meta({"hcs.io/job": "l", "scheduling.x-k8s.io/pod-group": "g"}),
                     JobKey("ns", "hcs", "l"), id="label-over-podgroup"),
        pytest.param(meta({"hcs.io/job": "l"}, {"hcs.io/job": "a"}),
                     JobKey("ns", "hcs", "a"), id="annotation-over-label"),
        pytest.param(meta({"job-name": "j"}, namespace="other"), JobKey("other", "job", "j"),
                     id="namespaced"),
        pytest.param(meta({"app": "web"}), None, id="lone-pod"),
        pytest.param(meta({"job-name": ""}), None, id="empty-name"),
        pytest.param({}, None, id="no-metadata"),
        pytest.param(meta({"batch.kubernetes.io/controller-uid": "u-1",
                           "batch.kubernetes.io/job-name": "j"}),
                     JobKey("ns", "job-uid", "u-1"), id="job-by-uid"),
        pytest.param(meta({"controller-uid": "u-1", "job-name": "j"}),
                     JobKey("ns", "job-uid", "u-1"), id="job-by-uid-legacy"),
        pytest.param(meta({"volcano.sh/job-name": "v", "jobset.sigs.k8s.io/jobset-name": "s"},
                          {"scheduling.k8s.io/group-name": "v-0a1b"}),
                     JobKey("ns", "volcano", "v-0a1b"), id="volcano-podgroup"),
        pytest.param(meta({"volcano.sh/job-name": "v", "batch.kubernetes.io/job-name": "j"}),
                     JobKey("ns", "volcano-job", "v"), id="volcano-job"),
        pytest.param(meta(annotations={"hcs.io/job": "x" * 100_000}), None, id="huge-name"),
        pytest.param(meta(annotations={"hcs.io/job": "a" * 64}), None, id="over-63"),
        pytest.param(meta(annotations={"hcs.io/job": "Has Spaces"}), None, id="not-dns-label"),
        pytest.param(meta(annotations={"scheduling.k8s.io/group-name": "g" * 254}), None,
                     id="annotation-over-253"),
    ],
)  # fmt: skip
def test_job_identity(pod: dict[str, Any], job: JobKey | None) -> None:
    assert job_of(pod) == job


def test_a_bad_job_name_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    pod = meta(annotations={"hcs.io/job": "Bad_" + "x" * 1000}, namespace="logged-once")
    for _ in range(3):
        assert job_of(pod) is None
    warnings = [r for r in caplog.records if "not a valid job name" in r.getMessage()]
    assert len(warnings) == 1 and len(warnings[0].getMessage()) < 300


@pytest.mark.parametrize(
    ("value", "size"),
    [("8", 8), ("0", 0), ("-1", 0), ("x", 0), ("100001", 0), ("9" * 400, 0), (None, 0)],
)
def test_job_size(value: str | None, size: int) -> None:
    annotations = {} if value is None else {"hcs.io/job-size": value}
    assert job_size(meta(annotations=annotations)) == size


def test_a_jobset_and_a_job_of_one_name_are_two_jobs() -> None:
    assert job_of(meta({"jobset.sigs.k8s.io/jobset-name": "x"})) != job_of(meta({"job-name": "x"}))


def test_the_index_counts_pods_per_node_and_forgets_them() -> None:
    index, job = JobIndex(), JobKey("ns", "job", "j")
    index.put("p1", job, "a")
    index.put("p2", job, "a")
    index.put("p2", job, "b")  # moved: counted once, where it is now
    assert index.nodes_of(job) == {"a": 1, "b": 1}
    index.drop("p1")
    index.drop("p2")
    index.drop("p3")  # never seen: nothing to do
    assert index.nodes_of(job) == {} and len(index) == 0


@pytest.mark.parametrize(("score", "inside", "outside"), [(0, 6, 0), (5, 8, 2), (10, 10, 5)])
def test_a_node_of_the_jobs_domain_outscores_every_other(score: int, inside: int,
                                                         outside: int) -> None:  # fmt: skip
    assert (lift(score, True), lift(score, False)) == (inside, outside)
    assert lift(0, True) > lift(10, False)


# --- the extender: two domains, "ib:a" (a1, a2) and "ib:b" (b1); 2 devices a node ---------


def fabric_node(name: str, domain: str, **kwargs: Any) -> dict[str, Any]:
    obj = node_object(name, **kwargs)
    obj["spec"]["fabric"] = {"domain": domain, "source": "infiniband", "ports": [], "notes": []}
    return obj


def cluster(nodes: dict[str, str], **kwargs: Any) -> Extender:
    e = Extender(Kube.__new__(Kube), lambda: Keyring({"k": b"k" * 32}, "k"), DB)
    for name, domain in nodes.items():
        e.state.nodes.apply(name, node_view(fabric_node(name, domain, **kwargs)))
        beat(e, name)
    return e


TWO_DOMAINS = {"a1": "ib:a", "a2": "ib:a", "b1": "ib:b"}


def job_pod(uid: str, *, job: str = "train", annotations: dict[str, str] | None = None,
            labels: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    return {
        "metadata": {"name": uid, "namespace": "ns", "uid": uid,
                     "labels": {"batch.kubernetes.io/job-name": job, **(labels or {})},
                     "annotations": annotations or {}},
        "spec": {"containers": [{"name": "main", "resources": {"limits": ONE}}]},
    }  # fmt: skip


def bound(e: Extender, uid: str, node: str, *, job: str = "train") -> None:
    """The pod shows in the pods informer, bound to `node` with one device."""
    info = assigned(uid, node, (0, 80))
    info = PodInfo(info.uid, info.namespace, info.name, info.node, info.holds,
                   JobKey("ns", "job", job))  # fmt: skip
    e.state.pods.apply(f"ns/{uid}", info)


def scores(e: Extender, pod: dict[str, Any]) -> dict[str, int]:
    answer = e.filter(pod, sorted(TWO_DOMAINS))
    return dict(e.prioritize(pod, sorted(answer.passed)))


def test_the_first_pod_of_a_job_prefers_the_domain_with_the_most_room() -> None:
    e = cluster(TWO_DOMAINS)  # ib:a has room for 4 such pods, ib:b for 2
    got = scores(e, job_pod("p1"))
    assert min(got["a1"], got["a2"]) >= 6 > got["b1"]


def test_room_counts_what_the_pod_asks_not_nodes() -> None:
    e = cluster(TWO_DOMAINS)
    bound(e, "other-1", "a1", job="other")  # ib:a: 3 free devices, ib:b: 2
    bound(e, "other-2", "a2", job="other")  # ib:a: 2, tie with ib:b: more nodes offered wins
    assert scores(e, job_pod("p1"))["a1"] >= 6
    e = cluster(TWO_DOMAINS)
    e.state.nodes.apply("a2", node_view(fabric_node("a2", "ib:a", count=1)))
    for uid, node in (("o1", "a1"), ("o2", "a2")):
        bound(e, uid, node, job="other")  # ib:a: 1 free device in 2 nodes, ib:b: 2
    got = scores(e, job_pod("p1"))
    assert got["b1"] >= 6 > got["a1"]


def test_the_jobs_pods_pull_the_rest_of_it_into_their_domain() -> None:
    e = cluster(TWO_DOMAINS)
    bound(e, "p0", "b1")  # the job already runs in ib:b, though ib:a has more room
    got = scores(e, job_pod("p1"))
    assert got["b1"] >= 6 > max(got["a1"], got["a2"])


def test_the_first_pods_choice_holds_until_its_pods_show() -> None:
    e = cluster(TWO_DOMAINS)
    assert scores(e, job_pod("p1"))["a1"] >= 6  # ib:a chosen
    for uid in ("x1", "x2", "x3"):
        bound(e, uid, "a1" if uid != "x3" else "a2", job="other")  # ib:a now has less room
    got = scores(e, job_pod("p2"))
    assert got["a2"] >= 6 > got["b1"]  # the job's second pod follows its first


def test_pods_of_no_job_and_clusters_without_domains_score_as_before() -> None:
    lone = {**job_pod("p1"), "metadata": {"name": "p1", "namespace": "ns", "uid": "p1"}}
    e = cluster(TWO_DOMAINS)
    plain = cluster({name: "" for name in TWO_DOMAINS})
    assert scores(e, lone) == scores(plain, lone)
    assert scores(plain, job_pod("p2")) == scores(plain, lone)


def test_high_bandwidth_refuses_nodes_outside_the_jobs_domain_as_unresolvable() -> None:
    e = cluster({**TWO_DOMAINS, "c1": ""})
    bound(e, "p0", "b1")
    answer = e.filter(job_pod("p1", annotations=HB), ["a1", "a2", "b1", "c1"])
    assert list(answer.passed) == ["b1"] and answer.failed == {}
    assert answer.unresolvable["a1"] == (
        "node in fabric domain ib:a; the job's is ib:b (hcs.io/topology-preference: high-bandwidth)"
    )
    assert answer.unresolvable["a1"] is answer.unresolvable["a2"]  # one string per domain
    assert answer.unresolvable["c1"].startswith("node reports no fabric domain; ")
    assert 'hcs_extender_refusals_total{reason="fabric"} 3.0' in e.metrics_text()
    wire = json.loads(filter_result(answer))
    assert sorted(wire["FailedAndUnresolvableNodes"]) == ["a1", "a2", "c1"]
    assert wire["FailedNodes"] == {}


def test_a_full_domain_keeps_a_high_bandwidth_job_waiting_and_lets_others_spill() -> None:
    e = cluster(TWO_DOMAINS)
    bound(e, "p0", "b1")
    e.state.nodes.apply("b1", node_view(fabric_node("b1", "ib:b", count=1,
                                                    allocated={0: ("p0", 80)})))  # fmt: skip
    waiting = e.filter(job_pod("p1", annotations=HB), sorted(TWO_DOMAINS))
    assert list(waiting.passed) == []
    assert "fabric domain ib:a" in waiting.unresolvable["a1"]
    assert "80Gi" not in waiting.unresolvable["a1"]
    assert "b1" in waiting.failed  # full: resolvable, preemption may free it
    spilling = e.filter(job_pod("p2"), sorted(TWO_DOMAINS))
    assert list(spilling.passed) == ["a1", "a2"]


def test_high_bandwidth_chooses_the_first_pods_domain_in_filter() -> None:
    """kube-scheduler may bind where prioritize did not put a pod first: the first pod of a
    high-bandwidth job is kept to the chosen domain by the filter already."""
    e = cluster(TWO_DOMAINS)
    answer = e.filter(job_pod("p1", annotations=HB), sorted(TWO_DOMAINS))
    assert sorted(answer.passed) == ["a1", "a2"] and list(answer.unresolvable) == ["b1"]
    second = e.filter(job_pod("p2", annotations=HB), sorted(TWO_DOMAINS))
    assert sorted(second.passed) == ["a1", "a2"]


def test_the_domain_is_chosen_from_the_whole_fleet_not_the_offered_sample() -> None:
    nodes = {f"a{i}": "ib:a" for i in range(6)} | {"b0": "ib:b", "b1": "ib:b"}
    e = cluster(nodes)
    offered = ["a0", "b0", "b1"]  # a sample: ib:a has the room, but only one node of it shows
    answer = e.filter(job_pod("p1", annotations=HB), offered)
    assert list(answer.passed) == ["a0"]


def interleave(e: Extender, jobs: dict[str, int], offered: list[str]) -> dict[str, list[str]]:
    """Each job's pods, one of each job in turn, filtered and bound where the filter lets them
    (the best-scored node with a free device), as kube-scheduler and the bind would."""
    placed: dict[str, list[str]] = {job: [] for job in jobs}
    for i in range(max(jobs.values())):
        for job, size in jobs.items():
            if i >= size:
                continue
            uid = f"{job}-{i}"
            pod = job_pod(uid, job=job, annotations={**HB, "hcs.io/job-size": str(size)})
            passed = list(e.filter(pod, offered).passed)
            if not passed:
                continue
            ranked = e.prioritize(pod, passed)
            node = max(ranked, key=lambda pair: (pair[1], pair[0]))[0]
            hold = assigned(uid, node, (len(placed_on(e, node)), 80)).holds
            e.state.assume(uid, node, hold, JobKey("ns", "job", job))
            placed[job].append(node)
    return placed


def placed_on(e: Extender, node: str) -> list[str]:
    return [uid for uid, n in e.state.jobs._pods.items() if n[1] == node]


def test_two_jobs_arriving_together_each_get_a_domain_they_fit_in() -> None:
    # ib:a: 5 nodes x 2 devices = 10 free; ib:b: 4 nodes x 2 = 8 free; two 8-pod jobs.
    nodes = {f"a{i}": "ib:a" for i in range(5)} | {f"b{i}": "ib:b" for i in range(4)}
    e = cluster(nodes)
    placed = interleave(e, {"one": 8, "two": 8}, sorted(nodes))
    domains = {job: {nodes[n] for n in where} for job, where in placed.items()}
    assert [len(where) for where in placed.values()] == [8, 8]
    assert domains["one"] != domains["two"] and all(len(d) == 1 for d in domains.values())


def test_a_bind_records_where_the_pod_went_before_the_informer_shows_it() -> None:
    e = cluster(TWO_DOMAINS)
    e.filter(job_pod("p1"), sorted(TWO_DOMAINS))
    e.prioritize(job_pod("p1"), sorted(TWO_DOMAINS))  # ib:a chosen for the job
    held = assigned("p1", "b1", (0, 80)).holds
    token = e.state.assume("p1", "b1", held, JobKey("ns", "job", "train"))
    assert token is not None
    got = dict(e.prioritize(job_pod("p2"), sorted(TWO_DOMAINS)))
    assert got["b1"] >= 6 > got["a1"]  # where p1 went, not the guess
    e.state.forget("p1", token)  # its Binding failed
    assert "p1" not in e.state.jobs


class _BindKube(Kube):
    def __init__(self, pods: dict[str, dict[str, Any]]) -> None:
        self.pods, self.bindings = pods, []  # type: ignore[var-annotated]

    def get(self, path: str, query: Any = ()) -> dict[str, Any]:
        return self.pods[path.rsplit("/", 1)[1]]

    def create(self, path: str, body: Any) -> dict[str, Any]:
        self.bindings.append(body)
        return {}


def test_the_binder_records_the_jobs_pod_at_bind() -> None:
    kube = _BindKube({"p1": job_pod("p1")})
    e = Extender(kube, lambda: Keyring({"k": b"k" * 32}, "k"), DB)
    for name, domain in TWO_DOMAINS.items():
        e.state.nodes.apply(name, node_view(fabric_node(name, domain)))
        beat(e, name)
    assert e.bind(BindRequest("ns", "p1", "p1", "b1")) == ""
    assert e.state.jobs.nodes_of(JobKey("ns", "job", "train")) == {"b1": 1}


def test_a_remembered_choice_expires_with_the_clock() -> None:
    now = [1000.0]
    e = cluster(TWO_DOMAINS)
    e.fabric.clock = lambda: now[0]
    assert scores(e, job_pod("p1"))["a1"] >= 6  # ib:a chosen
    for uid, node, device in (("x1", "a1", 0), ("x2", "a1", 1), ("x3", "a2", 0)):
        e.state.pods.apply(f"ns/{uid}", assigned(uid, node, (device, 80)))  # ib:a: 1 free, ib:b: 2
    now[0] += CHOICE_SECONDS - 1
    assert scores(e, job_pod("p2"))["a2"] >= 6  # still ib:a (and seen again: kept longer)
    now[0] += CHOICE_SECONDS + 1
    assert scores(e, job_pod("p3"))["b1"] >= 6  # gone: chosen afresh


def test_the_oldest_choice_goes_first_when_too_many_are_remembered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fabric_placement, "CHOICES", 3)
    e = cluster(TWO_DOMAINS)
    for job in ("j0", "j1", "j2", "j3"):
        e.filter(job_pod(f"{job}-p", job=job, annotations=HB), sorted(TWO_DOMAINS))
    kept = [key.name for key in e.fabric._chosen]
    assert kept == ["j1", "j2", "j3"]


def test_scores_are_unchanged_when_the_offered_nodes_share_one_domain() -> None:
    pod = job_pod("p1")
    pod["spec"]["containers"][0]["resources"]["limits"] = {"ai.compute/vram": "20Gi"}
    busy = {0: ("x", 70), 1: ("y", 40)}  # a2 and n2 score other than a1 and n1
    e = cluster({"a1": "ib:a", "n1": ""})
    e.state.nodes.apply("a2", node_view(fabric_node("a2", "ib:a", allocated=busy)))
    e.state.nodes.apply("n2", node_view(fabric_node("n2", "", allocated=busy)))
    plain = cluster({"a1": "", "n1": ""})
    for name in ("a2", "n2"):
        plain.state.nodes.apply(name, node_view(fabric_node(name, "", allocated=busy)))
    for names in (["a1", "a2"], ["n1", "n2"]):
        assert e.prioritize(pod, names) == plain.prioritize(pod, names)
        assert min(score for _, score in e.prioritize(pod, names)) < 6  # not lifted
    mixed = dict(e.prioritize(pod, ["a2", "n1"]))  # a domain and "none": two
    assert mixed["a2"] >= 6 > mixed["n1"]


def test_a_large_cluster_keeps_the_job_in_its_domain() -> None:
    nodes = {f"n{i:03}": f"ib:{i % 3}" for i in range(150)}
    e = cluster(nodes)
    bound(e, "p0", "n001")  # ib:1
    answer = e.filter(job_pod("p1", annotations=HB), sorted(nodes))
    assert len(answer.passed) == 50 and {nodes[n] for n in answer.passed} == {"ib:1"}
    assert len(answer.unresolvable) == 100
    got = dict(e.prioritize(job_pod("p1"), sorted(nodes)))
    assert min(got[n] for n in answer.passed) >= 6 > max(got[n] for n in answer.unresolvable)
    e.state.nodes.apply("n002", node_view(fabric_node("n002", "ib:1")))  # moved by its operator
    assert "n002" in e.filter(job_pod("p2", annotations=HB), sorted(nodes)).passed


def test_the_informers_pod_names_its_job_through_pod_info() -> None:
    keys = Keyring({"k": b"k" * 32}, "k")
    grants = {"main": (Grant("b1-0", 80 * GiB, 0),)}
    obj = {
        "metadata": {"name": "p0", "namespace": "ns", "uid": "p0",
                     "labels": {"batch.kubernetes.io/job-name": "train"},
                     "annotations": {"hcs.io/assignment": signed_assignment(
                         "b1", "p0", grants, keys, int(time.time()))}},
        "spec": {"nodeName": "b1"}, "status": {"phase": "Running"},
    }  # fmt: skip
    info = pod_info(obj, lambda: keys)
    assert info is not None and info.job == JobKey("ns", "job", "train")
    e = cluster(TWO_DOMAINS)
    e.state.pods.apply("ns/p0", info)
    got = scores(e, job_pod("p1"))
    assert got["b1"] >= 6 > got["a1"]


# --- the ComputeNode ------------------------------------------------------------------------


def test_the_computenode_carries_the_fabric_hcsd_reports() -> None:
    port = "mlx5_0/1 InfiniBand 200 Gb/sec (4X HDR) subnet fec0:0000:0000:0001"
    node = pb.Node(name="n", fabric_domain="ib:fec0:0000:0000:0001", fabric_source="infiniband",
                   fabric_ports=[port])  # fmt: skip
    spec = node_spec(node, [])
    assert spec["fabric"] == {
        "domain": "ib:fec0:0000:0000:0001", "source": "infiniband",
        "ports": [port],
        "notes": [],
    }  # fmt: skip
    assert "fabric" not in node_spec(pb.Node(name="n"), [])  # an older hcsd: as before
    obj = {"metadata": {"name": "n"}, "spec": spec, "status": {"phase": "Ready"}}
    assert node_view(obj).fabric == "ib:fec0:0000:0000:0001"


def test_promised_room_adds_up_under_concurrent_pods() -> None:
    """Threads deciding pods of the same jobs at once (the HTTP server's threads) leave the
    room promised per domain equal to what the remembered choices promise."""
    e = cluster({f"n{i}": f"ib:{i % 2}" for i in range(8)})
    names = sorted(f"n{i}" for i in range(8))

    def decide(worker: int) -> None:
        for i in range(40):
            job = f"j{i % 5}"
            pod = job_pod(f"{worker}-{i}", job=job, annotations={**HB, "hcs.io/job-size": "3"})
            e.filter(pod, names)

    threads = [threading.Thread(target=decide, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    fabric = e.fabric
    expected: Counter[str] = Counter()
    for choice in fabric._chosen.values():
        expected[choice.domain] += choice.promised
    assert +fabric._promised == +expected and len(fabric._chosen) == 5
