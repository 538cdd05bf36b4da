"""ComputeQuota at admission in DRA mode (hcsd/cluster/claim_quota.py) without a server: the
charge of a request, and the rule over allocated claims, pending pods and this process's own
recent admissions. The objects are held by a small in-memory API (the paths the gate reads);
tests/cluster/test_webhook_dra.py runs the same rule against the real kube-apiserver."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.claim_quota import QuotaGate, charge_of, read_charge
from hcsd.cluster.claim_shapes import claim_spec, template_name
from hcsd.cluster.compute_quota import Amounts
from hcsd.cluster.demand import Demand, demand_of
from hcsd.cluster.kube import KubeError
from hcsd.cluster.objects import compute_node, node_spec
from hcsd.cluster.webhook_dra import Refused, dra_patch
from hcsd.contract import dra
from hcsd.profiles.database import default_database

GiB = 2**30
NS = "team"
QUOTAS = f"/apis/hcs.io/v1alpha1/namespaces/{NS}/computequotas"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
PODS = f"/api/v1/namespaces/{NS}/pods"
TEMPLATES = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates"


class Api:
    """Lists and gets by path, as the gate asks them."""

    def __init__(self) -> None:
        self.lists: dict[str, list[dict[str, Any]]] = {
            QUOTAS: [],
            CLAIMS: [],
            PODS: [],
            TEMPLATES: [],
        }
        self.objects: dict[str, dict[str, Any]] = {}
        self.down = False
        self.paged: list[tuple[str, tuple[tuple[str, str], ...], int]] = []
        self.gets: list[str] = []

    def list_all(self, path: str) -> tuple[list[dict[str, Any]], str]:
        if self.down:
            raise KubeError(0, "Unreachable", f"GET {path}: refused")
        return list(self.lists.get(path, [])), "1"

    def pages(
        self, path: str, query: Sequence[tuple[str, str]] = (), *, page: int = 500
    ) -> Iterator[tuple[list[dict[str, Any]], str]]:
        items, version = self.list_all(path)
        self.paged.append((path, tuple(query), page))
        for start in range(0, max(len(items), 1), page):
            yield items[start : start + page], version

    def get(self, path: str) -> dict[str, Any]:
        self.gets.append(path)
        if path not in self.objects:
            raise KubeError(404, "NotFound", path)
        return self.objects[path]


def pod(**limits: str) -> dict[str, Any]:
    container = {"name": "main", "resources": {"limits": limits}}
    return {"metadata": {"namespace": NS, "annotations": {}}, "spec": {"containers": [container]}}


def demand(**limits: str) -> Demand:
    found = demand_of(pod(**{f"ai.compute/{k.replace('_', '-')}": v for k, v in limits.items()}))
    assert found is not None
    return found


def claim(**limits: str) -> dict[str, Any]:
    """The claim spec the webhook's template holds for `limits`."""
    return claim_spec(demand(**limits), default_database())


def quota(**hard: str) -> dict[str, Any]:
    return {"metadata": {"namespace": NS, "name": "q"},
            "spec": {"hard": {k.replace("_", "-"): v for k, v in hard.items()}}}  # fmt: skip


def allocated(uid: str, memory: str, compute: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": NS, "name": f"c-{uid}", "ownerReferences": [{"uid": uid}]},
        "status": {"allocation": {"devices": {"results": [
            {"request": "r0", "driver": dra.DRIVER, "pool": "n1", "device": "nvidia-0",
             "consumedCapacity": {"memory": memory, "compute": compute}}]}}},
    }  # fmt: skip


def a100_node() -> dict[str, Any]:
    device = pb.Device(uuid="u0", vendor="nvidia", model="A100-SXM4-80GB", index=0,
                       vram_bytes=80 * GiB, tflops_fp16=312.0)  # fmt: skip
    return compute_node("n1", node_spec(pb.Node(name="n1"), [device]))


def template_pod(
    api: Api, uid: str, phase: str = "Pending", claim_name: str | None = None, **limits: str
) -> dict[str, Any]:
    """A pod the webhook patched: its `hcs-accelerator` entry names the template of
    `limits` (added to the API's templates); `claim_name`: its generated claim."""
    spec = claim(**limits)
    name = template_name(spec)
    api.lists[TEMPLATES] = [t for t in api.lists[TEMPLATES] if t["metadata"]["name"] != name]
    api.lists[TEMPLATES].append({"metadata": {"name": name}, "spec": {"spec": spec}})
    status: dict[str, Any] = {"phase": phase}
    if claim_name is not None:
        status["resourceClaimStatuses"] = [
            {"name": dra.POD_CLAIM_NAME, "resourceClaimName": claim_name}
        ]
    return {"metadata": {"namespace": NS, "uid": uid, "name": f"pod-{uid}", "annotations": {}},
            "spec": {"resourceClaims": [{"name": dra.POD_CLAIM_NAME,
                                         "resourceClaimTemplateName": name}]},
            "status": status}  # fmt: skip


def test_charge_is_the_most_the_claim_can_hold() -> None:
    db = default_database()
    assert charge_of(claim(vram="16Gi"), db) == Amounts(16 * GiB, 0.0, 1)
    assert charge_of(claim(vram="1000Mi", devices="2"), db) == Amounts(2 * 1024 * 2**20, 0.0, 2)
    # Whole devices: the largest memory and FP16 figure of any model the claim allows.
    whole = charge_of(claim(devices="1"), db)
    assert (whole.vram, whole.devices) == (max(p.vram_bytes for p in db.profiles), 1)
    assert whole.tflops == max(p.figure("tflops_fp16") for p in db.profiles)
    # 100 TFLOPS: at least the TFLOPS asked (a share rounds up), never 0.
    assert charge_of(claim(tflops_fp16="100"), db).tflops >= 100
    # With VRAM too: the multi-device alternatives reserve no compute, the one-device
    # alternatives do; the charge is the larger (the review's case: it was 0).
    assert charge_of(claim(tflops_fp16="100", vram="8Gi"), db).tflops >= 100


def test_a_claim_naming_an_unknown_model_is_refused_where_a_quota_is() -> None:
    spec = claim(vram="8Gi")
    unknown = (f'cel.bind(a, device.attributes["{dra.DRIVER}"], has(a.{dra.ATTR_MODEL}) && '
               f'a.{dra.ATTR_MODEL}.lowerAscii() in ["nosuchchip"])')  # fmt: skip
    for request in spec["devices"]["requests"]:
        for option in request.get("firstAvailable") or [request["exactly"]]:
            option["selectors"] = [{"cel": {"expression": unknown}}]
    api = Api()
    api.lists[QUOTAS] = [quota(vram="32Gi")]
    with pytest.raises(Refused, match="cannot be charged") as refused:
        QuotaGate(api, default_database()).admit(NS, spec, dry_run=False)
    assert refused.value.code == 403
    assert read_charge(QuotaGate(Api(), default_database()).admit(NS, spec, dry_run=False))


def test_within_the_quota_admitted_over_it_refused_with_the_figures() -> None:
    api = Api()
    api.lists[QUOTAS] = [quota(vram="32Gi")]
    gate = QuotaGate(api, default_database())
    first = gate.admit(NS, claim(vram="16Gi"), dry_run=False)
    assert read_charge(first) is not None
    gate.admit(NS, claim(vram="16Gi"), dry_run=False)  # 32Gi: at the limit, not over it
    with pytest.raises(Refused) as refused:
        gate.admit(NS, claim(vram="1Gi"), dry_run=False)
    assert refused.value.code == 403
    assert str(refused.value) == (
        f"ComputeQuota {NS}/q: vram 32Gi used + 1Gi requested exceeds the limit 32Gi"
    )


def test_no_quota_no_refusal_but_the_charge_is_written() -> None:
    gate = QuotaGate(Api(), default_database())
    for _ in range(5):
        assert read_charge(gate.admit(NS, claim(vram="80Gi"), dry_run=False)) is not None


def test_allocated_claims_count_what_they_hold_and_their_pods_not_twice() -> None:
    api = Api()
    api.lists[QUOTAS] = [quota(tflops_fp16="200")]
    api.objects["/apis/hcs.io/v1alpha1/computenodes/n1"] = a100_node()
    api.lists[CLAIMS] = [allocated("p1", "16Gi", "50")]  # 156 TFLOPS of the A100
    # Its pod names the allocated claim in its status: counted once, from the claim.
    api.lists[PODS] = [template_pod(api, "p1", claim_name="c-p1", tflops_fp16="150")]
    gate = QuotaGate(api, default_database())
    assert gate.used(NS) == Amounts(16 * GiB, 156.0, 1)
    with pytest.raises(Refused, match=r"tflops-fp16 156 used \+ .* exceeds the limit 200"):
        gate.admit(NS, claim(tflops_fp16="100"), dry_run=False)


def test_pending_pods_count_by_their_template_finished_ones_do_not() -> None:
    api = Api()
    api.lists[QUOTAS] = [quota(devices="2")]
    api.lists[PODS] = [template_pod(api, "p1", vram="1Gi"),
                       template_pod(api, "p2", "Succeeded", vram="1Gi"),
                       {"metadata": {"uid": "p3"}, "spec": {}, "status": {}}]  # fmt: skip
    gate = QuotaGate(api, default_database())
    assert gate.used(NS) == Amounts(GiB, 0.0, 1)
    gate.admit(NS, claim(vram="1Gi"), dry_run=False)
    with pytest.raises(Refused, match="devices 2 used"):
        gate.admit(NS, claim(vram="1Gi"), dry_run=False)


def test_nothing_a_tenant_writes_on_a_pod_lowers_what_it_is_charged() -> None:
    """The review's bypasses: a forged or zeroed charge annotation (on a pod the webhook
    never saw, or changed after admission), and a user-written allocated claim whose owner
    reference names the pending pod: the pending pod is still charged from its template."""
    api = Api()
    api.lists[QUOTAS] = [quota(vram="100Gi")]
    pending = template_pod(api, "big", vram="64Gi")
    pending["metadata"]["annotations"][dra.ANNOTATION_QUOTA_CHARGE] = (
        '{"vram":0,"tflops":0,"devices":0,"token":"x"}')  # fmt: skip
    forged_pod = {"metadata": {"uid": "f", "annotations": {dra.ANNOTATION_QUOTA_CHARGE:
                  '{"vram":-1e15,"tflops":0,"devices":-9,"token":"y"}'}},
                  "spec": {}, "status": {"phase": "Pending"}}  # fmt: skip
    forged_claim = allocated("big", "256Mi", "0")  # owner: the pending pod's uid
    api.objects["/apis/hcs.io/v1alpha1/computenodes/n1"] = a100_node()
    api.lists[CLAIMS] = [forged_claim]
    api.lists[PODS] = [pending, forged_pod]
    gate = QuotaGate(api, default_database())
    assert gate.used(NS).vram == 64 * GiB + 256 * 2**20
    with pytest.raises(Refused, match="vram"):
        gate.admit(NS, claim(vram="40Gi"), dry_run=False)


def test_an_admitted_pod_counts_until_listed_then_once_and_a_record_expires() -> None:
    api = Api()
    api.lists[QUOTAS] = [quota(devices="5")]
    now = [0.0]
    gate = QuotaGate(api, default_database(), window=30.0, clock=lambda: now[0])
    annotation = gate.admit(NS, claim(vram="1Gi"), dry_run=False)
    assert gate.used(NS).devices == 1  # not listed yet: this process's record
    listed = template_pod(api, "p1", vram="1Gi")
    listed["metadata"]["annotations"][dra.ANNOTATION_QUOTA_CHARGE] = annotation
    api.lists[PODS] = [listed]
    assert gate.used(NS).devices == 1  # listed: the pod, not the record as well
    api.lists[PODS] = []
    assert gate.used(NS).devices == 0  # the record was dropped when the pod showed
    gate.admit(NS, claim(vram="1Gi"), dry_run=False)  # never stored (refused elsewhere)
    now[0] = 31.0
    assert gate.used(NS).devices == 0


def test_dry_runs_and_released_charges_leave_no_record() -> None:
    api = Api()
    api.lists[QUOTAS] = [quota(devices="1")]
    gate = QuotaGate(api, default_database())
    gate.admit(NS, claim(vram="1Gi"), dry_run=True)
    gate.release(gate.admit(NS, claim(vram="1Gi"), dry_run=False))
    assert gate.used(NS) == Amounts()


def test_the_patch_writes_the_charge_and_a_failed_template_releases_it() -> None:
    api = Api()
    api.lists[QUOTAS] = [quota(devices="1")]
    gate = QuotaGate(api, default_database())
    body = pod(**{"ai.compute/vram": "1Gi"})
    body["metadata"]["annotations"] = {dra.ANNOTATION_QUOTA_CHARGE: "forged"}
    outcome = dra_patch(body, NS, lambda *_: None, quota=gate)
    (op,) = [o for o in outcome.patch if "annotations" in o["path"]]
    assert op["path"] == "/metadata/annotations/hcs.io~1quota-charge"
    assert read_charge(op["value"]) is not None  # the forged value replaced

    def unavailable(*_: object, **__: object) -> None:
        from hcsd.cluster.webhook_dra import TemplateUnavailable

        raise TemplateUnavailable("no answer")

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("a bug in the template's making")

    gate = QuotaGate(api, default_database())
    with pytest.raises(Refused):
        dra_patch(body, NS, unavailable, quota=gate)
    assert gate.used(NS) == Amounts()  # the refused pod is not charged
    with pytest.raises(RuntimeError):  # any error: the pod is not created, nor charged
        dra_patch(body, NS, broken, quota=gate)
    assert gate.used(NS) == Amounts()


def test_an_api_server_that_cannot_be_asked_refuses_for_a_retry() -> None:
    api = Api()
    api.down = True
    with pytest.raises(Refused, match="a retry may pass") as refused:
        QuotaGate(api, default_database()).admit(NS, claim(vram="1Gi"), dry_run=False)
    assert refused.value.code == 500


def test_decisions_of_one_namespace_are_one_at_a_time() -> None:
    """Two admissions at once where one fits (several API servers call one replica at once):
    the second waits for the first's decision and record, then is refused. The clock is slow
    so that, without the lock, both would read the records before either wrote one."""

    def slow_clock() -> float:
        time.sleep(0.2)
        return time.monotonic()

    api = Api()
    api.lists[QUOTAS] = [quota(devices="1")]
    gate = QuotaGate(api, default_database(), clock=slow_clock)
    outcomes: list[str] = []

    def one() -> None:
        try:
            gate.admit(NS, claim(vram="1Gi"), dry_run=False)
            outcomes.append("admitted")
        except Refused:
            outcomes.append("refused")

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(outcomes) == ["admitted", "refused"]


@pytest.mark.parametrize(
    "forged",
    [
        '{"vram":-1e12,"tflops":0,"devices":0}',
        '{"vram":0,"tflops":NaN,"devices":0}',
        '{"vram":1e999,"tflops":0,"devices":0}',
        '{"vram":0,"tflops":-5,"devices":-1}',
        "[1]",
    ],
)
def test_a_forged_charge_is_no_charge_and_raises_nothing(forged: str) -> None:
    assert read_charge(forged) is None


class Blocking(Api):
    """Namespace `slow` has a ComputeQuota, and the list of its claims waits on `release`:
    its admission holds its turn as long as the test wants, as a namespace whose lists are
    huge would. Other namespaces have no quota."""

    SLOW_CLAIMS = "/apis/resource.k8s.io/v1/namespaces/slow/resourceclaims"

    def __init__(self) -> None:
        super().__init__()
        self.lists["/apis/hcs.io/v1alpha1/namespaces/slow/computequotas"] = [quota(vram="1Ti")]
        self.entered = threading.Event()
        self.release = threading.Event()

    def list_all(self, path: str) -> tuple[list[dict[str, Any]], str]:
        if path == self.SLOW_CLAIMS:
            self.entered.set()
            assert self.release.wait(10)
        return super().list_all(path)


def test_a_namespace_that_makes_its_admissions_slow_slows_only_itself() -> None:
    """One admission of a namespace in progress and two waiting; a fourth is refused at once
    as busy (429, retryable). Another namespace is admitted meanwhile, and once all is done
    no namespace is remembered (names a caller made up leave nothing behind)."""
    api = Blocking()
    gate = QuotaGate(api, default_database(), waiting=2, turn_wait=10.0)
    outcomes: list[str] = []

    def admit(namespace: str) -> None:
        try:
            gate.admit(namespace, claim(vram="1Gi"), dry_run=True)
            outcomes.append(f"{namespace} admitted")
        except Refused as e:
            outcomes.append(f"{namespace} refused {e.code}")

    first = threading.Thread(target=admit, args=("slow",))
    first.start()
    assert api.entered.wait(10)
    waiters = [threading.Thread(target=admit, args=("slow",)) for _ in range(2)]
    for thread in waiters:
        thread.start()
    deadline = time.monotonic() + 10
    while gate._turns["slow"].queued < 3:  # the two are queued behind the first
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with pytest.raises(Refused, match="too many admissions of this namespace") as busy:
        gate.admit("slow", claim(vram="1Gi"), dry_run=True)
    assert busy.value.code == 429 and "a retry may pass" in str(busy.value)
    admit(NS)  # another namespace: not held up
    assert outcomes == [f"{NS} admitted"]
    api.release.set()
    for thread in [first, *waiters]:
        thread.join(10)
    assert sorted(outcomes) == sorted([f"{NS} admitted"] + ["slow admitted"] * 3)
    assert gate._turns == {}


def test_a_turn_not_given_within_its_wait_is_refused_as_busy() -> None:
    api = Blocking()
    gate = QuotaGate(api, default_database(), turn_wait=0.2)
    first = threading.Thread(target=gate.admit, args=("slow", claim(vram="1Gi"), True))
    first.start()
    assert api.entered.wait(10)
    with pytest.raises(Refused, match="a retry may pass") as busy:
        gate.admit("slow", claim(vram="1Gi"), dry_run=True)
    assert busy.value.code == 429
    api.release.set()
    first.join(10)
    assert gate._turns == {}


def test_pods_are_read_a_page_at_a_time_without_the_ended_ones() -> None:
    api = Api()
    api.lists[QUOTAS] = [quota(vram="100Gi")]
    api.lists[PODS] = [template_pod(api, f"p{i}", vram="1Gi") for i in range(60)]
    gate = QuotaGate(api, default_database(), page=25)
    assert gate.used(NS) == Amounts(60 * GiB, 0.0, 60)  # 3 pages, every pod counted once
    selector = ("fieldSelector", "status.phase!=Failed,status.phase!=Succeeded")
    assert api.paged == [(PODS, (selector,), 25)]


def test_a_compute_node_is_read_once_within_its_time_to_live() -> None:
    api = Api()
    api.lists[QUOTAS] = [quota(tflops_fp16="1000")]
    api.lists[CLAIMS] = [allocated("a", "16Gi", "50")]
    node = "/apis/hcs.io/v1alpha1/computenodes/n1"
    api.objects[node] = a100_node()
    now = [100.0]
    gate = QuotaGate(api, default_database(), clock=lambda: now[0], view_ttl=10.0)
    assert gate.used(NS).tflops == pytest.approx(156.0)
    now[0] += 5
    assert gate.used(NS).tflops == pytest.approx(156.0)
    assert api.gets.count(node) == 1
    now[0] += 6  # past its time to live: read again
    gate.used(NS)
    assert api.gets.count(node) == 2


def api_with_a_192gi_device(limits: dict[str, Any]) -> Api:
    """The namespace's quota `limits`, and a node publishing a 192Gi device of a model the
    database does not know (an admin added it), bigger than any it knows."""
    big = pb.Device(uuid="u9", vendor="nvidia", model="Mystery-192GB", index=0,
                    vram_bytes=192 * GiB, tflops_fp16=2500.0)  # fmt: skip
    api = Api()
    api.lists[QUOTAS] = [limits]
    api.lists["/apis/hcs.io/v1alpha1/computenodes"] = [
        compute_node("n9", node_spec(pb.Node(name="n9"), [big]))
    ]
    return api


def test_a_whole_device_is_charged_at_the_largest_device_published_too() -> None:
    """A node publishing a device bigger than any model the database knows (a model an
    admin added): a whole-device request is charged its memory and FP16 figure, so a
    150Gi quota refuses it although the database's largest is under 150Gi."""
    db = default_database()
    assert max(p.vram_bytes for p in db.profiles) < 150 * GiB
    api = api_with_a_192gi_device(quota(vram="150Gi"))
    whole = charge_of(claim(devices="1"), db, QuotaGate(api, db)._published_devices())
    assert (whole.vram, whole.tflops) == (192 * GiB, 2500.0)
    with pytest.raises(Refused, match="exceeds the limit 150Gi"):
        QuotaGate(api, db).admit(NS, claim(devices="1"), dry_run=True)
    assert read_charge(QuotaGate(api, db).admit(NS, claim(vram="16Gi"), dry_run=True))


def test_a_namespace_without_a_quota_takes_no_turn() -> None:
    """Nothing to decide, nothing serialized: twenty admissions at once all pass even with
    no room to wait for a turn (a burst of a Job's pods in a namespace without a quota)."""
    gate = QuotaGate(Api(), default_database(), waiting=0, turn_wait=0.0)
    outcomes: list[str] = []

    def one() -> None:
        outcomes.append(gate.admit(NS, claim(vram="1Gi"), dry_run=False))

    threads = [threading.Thread(target=one) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(outcomes) == 20 and gate._turns == {}


def test_a_decision_the_api_server_stopped_waiting_for_is_refused_not_recorded() -> None:
    """Past `deadline` the API server has refused the pod (timeoutSeconds, failurePolicy
    Fail): its charge must not be counted for the window, so the answer is a retryable 429."""
    api = Blocking()
    gate = QuotaGate(api, default_database(), deadline=0.3)
    threading.Timer(0.6, api.release.set).start()
    with pytest.raises(Refused, match=r"the decision took \d\.\ds") as late:
        gate.admit("slow", claim(vram="1Gi"), dry_run=False)
    assert late.value.code == 429 and "a retry may pass" in str(late.value)
    assert gate._admitted == {} and gate._turns == {}


def test_a_listed_pending_pod_is_counted_as_it_was_charged() -> None:
    """Once its pod is listed the record goes and the pod counts from its template: by the
    published devices too, or a second whole-device pod would pass on a smaller count."""
    api = api_with_a_192gi_device(quota(vram="380Gi"))
    api.lists[PODS] = [template_pod(api, "p1", devices="1")]
    gate = QuotaGate(api, default_database())
    assert gate.used(NS).vram == 192 * GiB
    with pytest.raises(Refused, match="exceeds the limit 380Gi"):
        gate.admit(NS, claim(devices="1"), dry_run=False)
