"""A job's pods on one fabric domain: who is one job, which domain is the job's, the scores
prioritize gives, and what the filter refuses under `high-bandwidth`."""

from __future__ import annotations

from typing import Any

import pytest

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.extender import Extender
from hcsd.cluster.fabric_jobs import JobIndex, JobKey, job_of, job_size
from hcsd.cluster.fabric_placement import lift
from hcsd.cluster.holds import PodInfo
from hcsd.cluster.kube import Kube
from hcsd.cluster.objects import node_spec, node_view
from hcsd.contract.keyring import Keyring
from hcsd.profiles.database import ProfileDatabase
from tests.unit.fleet import assigned, beat, node_object

DB = ProfileDatabase.load(None)
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


def test_high_bandwidth_refuses_nodes_outside_the_jobs_domain_with_the_reason() -> None:
    e = cluster({**TWO_DOMAINS, "c1": ""})
    bound(e, "p0", "b1")
    answer = e.filter(job_pod("p1", annotations=HB), ["a1", "a2", "b1", "c1"])
    assert list(answer.passed) == ["b1"]
    assert answer.failed["a1"] == (
        "node is in fabric domain ib:a; the pods of job ns/train run in fabric domain ib:b "
        "(hcs.io/topology-preference: high-bandwidth keeps a job on one fabric)"
    )
    assert answer.failed["c1"].startswith("node reports no fabric domain; ")
    assert 'hcs_extender_refusals_total{reason="fabric"} 3.0' in e.metrics_text()


def test_a_full_domain_keeps_a_high_bandwidth_job_waiting_and_lets_others_spill() -> None:
    e = cluster(TWO_DOMAINS)
    bound(e, "p0", "b1")
    e.state.nodes.apply("b1", node_view(fabric_node("b1", "ib:b", count=1,
                                                    allocated={0: ("p0", 80)})))  # fmt: skip
    waiting = e.filter(job_pod("p1", annotations=HB), sorted(TWO_DOMAINS))
    assert list(waiting.passed) == []
    assert "fabric domain ib:b" in waiting.failed["a1"] and "80Gi" not in waiting.failed["a1"]
    spilling = e.filter(job_pod("p2"), sorted(TWO_DOMAINS))
    assert list(spilling.passed) == ["a1", "a2"]


def test_high_bandwidth_before_the_job_has_a_domain_refuses_nothing() -> None:
    e = cluster(TWO_DOMAINS)
    assert sorted(e.filter(job_pod("p1", annotations=HB), sorted(TWO_DOMAINS)).passed) == [
        "a1", "a2", "b1"
    ]  # fmt: skip


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
