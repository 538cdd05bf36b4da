"""Who may make the extender bind, and what it signs, against the real control plane.

The extender serves its verbs over mutual TLS to kube-scheduler's client certificate (the
real kube-scheduler of the fixture calls it so for every pod here); bind reads the pod from
the API server and signs what that object asks, whatever a /filter body claimed. Its HTTP
server bounds bodies and connections. ComputeQuota `status.used` is the sum of the live
signed assignments, across restarts of the extender.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hcsd.cluster.kube import KubeError
from hcsd.contract.assignment import ANNOTATION, verify
from hcsd.quantity import parse_bytes
from tests.cluster.conftest import MANUAL_SCHEDULER, Cluster, GiB, unschedulable_message
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.slow

MiB = 2**20


def connect(cluster: Cluster, client: str | None) -> http.client.HTTPSConnection:
    """An HTTPS connection to the scheduling port, presenting `client`'s certificate."""
    certs: Path = cluster.plane.work / "certs"
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    if client is not None:
        context.load_cert_chain(str(certs / f"{client}.crt"), str(certs / f"{client}.key"))
    return http.client.HTTPSConnection(
        "127.0.0.1", cluster.extender_port, context=context, timeout=30
    )


def call(cluster: Cluster, path: str, body: dict[str, Any], client: str = "scheduler") -> Any:
    connection = connect(cluster, client)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def make_pod(
    cluster: Cluster,
    name: str,
    limits: dict[str, str],
    *,
    namespace: str = "default",
    scheduler: str = "default-scheduler",
) -> dict[str, Any]:
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"schedulerName": scheduler,
                 "containers": [{"name": "main", "image": "busybox",
                                 "resources": {"limits": limits}}]},
    }  # fmt: skip
    return cluster.kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)


def get_pod(cluster: Cluster, name: str, namespace: str = "default") -> dict[str, Any]:
    return cluster.kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def forged_filter(pod: dict[str, Any], node: str) -> dict[str, Any]:
    """A /filter body for `pod` that claims two whole 80Gi devices."""
    claimed = json.loads(json.dumps(pod))
    limits = {"ai.compute/vram": "80Gi", "ai.compute/devices": "2"}
    claimed["spec"]["containers"][0]["resources"] = {"limits": limits}
    return {"Pod": claimed, "NodeNames": [node]}


def bind_args(pod: dict[str, Any], node: str) -> dict[str, str]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
            "Node": node}  # fmt: skip


def test_a_client_without_a_certificate_is_refused_at_the_tls_layer(cluster: Cluster) -> None:
    pod = make_pod(cluster, "anonymous-target", {"ai.compute/vram": "1Gi"},
                   scheduler=MANUAL_SCHEDULER)  # fmt: skip
    connection = connect(cluster, None)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        body = json.dumps(bind_args(pod, "gpu-node"))
        connection.request("POST", "/bind", body, {"Content-Type": "application/json"})
        connection.getresponse()
    # Nor in plain HTTP: the port speaks TLS only.
    with socket.create_connection(("127.0.0.1", cluster.extender_port), timeout=10) as plain:
        plain.sendall(b"POST /bind HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        try:
            answer = plain.recv(1024)
        except ConnectionResetError:
            answer = b""
        assert not answer.startswith(b"HTTP/")
    assert "nodeName" not in get_pod(cluster, "anonymous-target")["spec"]
    cluster.delete_pod("anonymous-target")


def test_a_certificate_of_another_name_is_refused(cluster: Cluster) -> None:
    """The syncer's certificate comes from the same CA: a valid certificate, the wrong name."""
    pod = make_pod(cluster, "wrong-name-target", {"ai.compute/vram": "1Gi"},
                   scheduler=MANUAL_SCHEDULER)  # fmt: skip
    status, answer = call(cluster, "/bind", bind_args(pod, "gpu-node"), client="syncer")
    assert status == 403
    assert "system:serviceaccount:hcs-system:hcs-syncer" in answer["Error"]
    assert "not allowed" in answer["Error"]
    assert "nodeName" not in get_pod(cluster, "wrong-name-target")["spec"]
    cluster.delete_pod("wrong-name-target")


def test_a_pod_of_another_scheduler_gets_nothing_whatever_filter_said(cluster: Cluster) -> None:
    """The issue's attack, with kube-scheduler's own certificate: a pod no scheduler here
    serves, asking 1Gi, and a /filter body claiming 2x80Gi for it."""
    pod = make_pod(cluster, "not-ours", {"ai.compute/vram": "1Gi"}, scheduler="nobody")
    status, answer = call(cluster, "/filter", forged_filter(pod, "gpu-node"))
    assert status == 200 and answer["NodeNames"] == ["gpu-node"]  # a filter answer, no more
    status, answer = call(cluster, "/bind", bind_args(pod, "gpu-node"))
    assert status == 200
    assert "is scheduled by 'nobody', which this extender does not serve" in answer["Error"]
    stored = get_pod(cluster, "not-ours")
    assert "nodeName" not in stored["spec"]
    assert ANNOTATION not in (stored["metadata"].get("annotations") or {})
    # A uid that is not the stored pod's (a pod deleted and made again under its name).
    pod["metadata"]["uid"] = "0000-not-the-uid"
    status, answer = call(cluster, "/bind", bind_args(pod, "gpu-node"))
    assert "has uid" in answer["Error"]
    cluster.delete_pod("not-ours")


def test_bind_signs_what_the_stored_pod_asks_not_what_filter_said(cluster: Cluster) -> None:
    pod = make_pod(cluster, "asks-1gi", {"ai.compute/vram": "1Gi"}, scheduler=MANUAL_SCHEDULER)
    status, answer = call(cluster, "/filter", forged_filter(pod, "gpu-node"))
    assert status == 200
    status, answer = call(cluster, "/bind", bind_args(pod, "gpu-node"))
    assert (status, answer) == (200, {"Error": ""})
    bound = get_pod(cluster, "asks-1gi")
    assert bound["spec"]["nodeName"] == "gpu-node"
    signed = verify(bound["metadata"]["annotations"][ANNOTATION], cluster.node_keys("gpu-node"),
                    node="gpu-node", pod_uid=bound["metadata"]["uid"], now=time.time(),
                    max_age=60)  # fmt: skip
    assert [g.vram_bytes for g in signed.containers["main"]] == [1 * GiB]
    cluster.delete_pod("asks-1gi")


def refused_by_policy(attempt: Callable[[], object]) -> str:
    """The API server's refusal of `attempt` by the assignment policy (it is served a moment
    after it is created: retried until then)."""
    refusal = ""

    def refused() -> bool:
        nonlocal refusal
        try:
            attempt()
        except KubeError as e:
            refusal = str(e)
            return "written only by hcs-scheduler-extender" in refusal
        return False

    wait_for(refused, "the assignment policy refuses the write")
    return refusal


def test_the_assignment_annotation_is_the_extenders_alone(cluster: Cluster) -> None:
    """Written through the Binding only: no pod is created with it, nor has it added,
    changed or removed (so a tenant cannot hide what its namespace is charged)."""
    pod = make_pod(cluster, "annotated", {"ai.compute/vram": "1Gi"}, scheduler=MANUAL_SCHEDULER)
    assert call(cluster, "/bind", bind_args(pod, "gpu-node")) == (200, {"Error": ""})
    text = get_pod(cluster, "annotated")["metadata"]["annotations"][ANNOTATION]
    path = "/api/v1/namespaces/default/pods/annotated"

    def annotate(value: str | None) -> Callable[[], object]:
        return lambda: cluster.kube.patch(path, {"metadata": {"annotations": {ANNOTATION: value}}})

    refused_by_policy(annotate(None))  # removed
    refused_by_policy(annotate(text.replace('"vram"', '"vram" ')))  # changed
    copy = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "born-annotated", "namespace": "default",
                     "annotations": {ANNOTATION: text}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }  # fmt: skip
    refused_by_policy(lambda: cluster.kube.create("/api/v1/namespaces/default/pods", copy))
    cluster.kube.patch(path, {"metadata": {"annotations": {"team": "a"}}})  # others: as ever
    assert get_pod(cluster, "annotated")["metadata"]["annotations"][ANNOTATION] == text
    cluster.delete_pod("annotated")


def test_the_assignment_annotation_cannot_be_dropped_through_pods_status(cluster: Cluster) -> None:
    """pods/status writes metadata too (a kubelet's credentials, or anyone who may patch it):
    the policy covers it, and still not pods/binding, so the extender's bind goes through."""
    pod = make_pod(cluster, "status-writer", {"ai.compute/vram": "1Gi"},
                   scheduler=MANUAL_SCHEDULER)  # fmt: skip
    assert call(cluster, "/bind", bind_args(pod, "gpu-node")) == (200, {"Error": ""})
    text = get_pod(cluster, "status-writer")["metadata"]["annotations"][ANNOTATION]
    status = "/api/v1/namespaces/default/pods/status-writer/status"
    refused_by_policy(
        lambda: cluster.kube.patch(status, {"metadata": {"annotations": {ANNOTATION: None}}})
    )
    cluster.kube.patch(status, {"metadata": {"annotations": {"team": "a"}}})  # others: as ever
    annotations = get_pod(cluster, "status-writer")["metadata"]["annotations"]
    assert annotations[ANNOTATION] == text and annotations["team"] == "a"
    cluster.delete_pod("status-writer")


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def oversized(cluster: Cluster, size: int, *, send_body: bool = True) -> bytes:
    """POST a `size`-byte /filter body with kube-scheduler's certificate; the status line
    (empty when the refusal's close reset the connection before the answer was read)."""
    connection = connect(cluster, "scheduler")
    connection.connect()
    sock = connection.sock
    assert sock is not None
    head = f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode()
    chunk = b"x" * MiB
    try:
        sock.sendall(head)
        for _ in range(size // MiB if send_body else 0):
            sock.sendall(chunk)
    except OSError:
        pass  # refused before the body was sent: the server closed the connection
    try:
        return sock.recv(4096).split(b"\r\n", 1)[0]
    except OSError:
        return b""
    finally:
        connection.close()


def test_oversized_bodies_are_refused_unread_and_scheduling_goes_on(cluster: Cluster) -> None:
    assert cluster.extender is not None
    pid = cluster.extender.pid
    before = rss(pid)
    assert oversized(cluster, 60 * MiB, send_body=False).startswith(b"HTTP/1.1 413")
    status: list[bytes] = []
    senders = [
        threading.Thread(target=lambda: status.append(oversized(cluster, 60 * MiB)))
        for _ in range(8)
    ]
    for sender in senders:
        sender.start()
    make_pod(cluster, "during-flood", {"ai.compute/vram": "2Gi"})  # through kube-scheduler
    pod = cluster.wait_pod("during-flood", timeout=60)
    assert pod["spec"].get("nodeName"), unschedulable_message(pod)
    for sender in senders:
        sender.join(60)
    after = rss(pid)
    print(f"extender RSS {before / MiB:.0f} MiB -> {after / MiB:.0f} MiB; answers {status}")
    assert after - before < 30 * MiB  # 9 x 60 MiB offered; none of it kept
    assert all(line.startswith(b"HTTP/1.1 413") or not line for line in status)
    metrics = probe_text(f"{cluster.probe_url}/metrics")
    assert 'hcs_extender_connections_refused_total{port="scheduling",reason="body"}' in metrics
    cluster.delete_pod("during-flood")


def probe_text(url: str) -> str:
    """The text of a plain GET on the probe port."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


# --- ComputeQuota status.used across restarts -------------------------------------------------


def live_assignments(cluster: Cluster, namespace: str) -> int:
    """VRAM of the namespace's pods whose assignment verifies for them: what hcsd would give."""
    total = 0
    for pod in cluster.kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        text = (pod["metadata"].get("annotations") or {}).get(ANNOTATION)
        node = pod["spec"].get("nodeName")
        if not text or not node or pod["metadata"].get("deletionTimestamp"):
            continue
        try:
            signed = verify(text, cluster.node_keys(node), node=node,
                            pod_uid=pod["metadata"]["uid"], now=time.time(),
                            max_age=3600)  # fmt: skip
        except ValueError:
            continue
        total += sum(g.vram_bytes for grants in signed.containers.values() for g in grants)
    return total


def used_vram(cluster: Cluster, namespace: str) -> int | None:
    quota = cluster.kube.get(f"/apis/hcs.io/v1alpha1/namespaces/{namespace}/computequotas/q")
    used = (quota.get("status") or {}).get("used") or {}
    return parse_bytes(used["vram"], what="vram") if "vram" in used else None


def created(cluster: Cluster, path: str, body: dict[str, Any]) -> bool:
    try:
        cluster.kube.create(path, body)
        return True
    except KubeError as e:
        if e.conflict:
            return True
        if "written only by hcs-scheduler-extender" in str(e):
            return False  # the deleted binding is still in the API server's cache
        raise


def test_quota_used_is_the_sum_of_live_assignments_across_restarts(cluster: Cluster) -> None:
    ns = "team-restarts"
    cluster.kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": ns}})  # fmt: skip
    cluster.kube.create(f"/apis/hcs.io/v1alpha1/namespaces/{ns}/computequotas", {
        "apiVersion": "hcs.io/v1alpha1", "kind": "ComputeQuota",
        "metadata": {"name": "q", "namespace": ns}, "spec": {"hard": {"vram": "200Gi"}},
    })  # fmt: skip

    def settled(expected_gib: int) -> None:
        def exact() -> bool:
            live = live_assignments(cluster, ns)
            return live == expected_gib * GiB and used_vram(cluster, ns) == live

        wait_for(exact, f"status.used of {ns}/q is {expected_gib}Gi, the live assignments",
                 timeout=60)  # fmt: skip

    def bound(name: str, vram: str) -> dict[str, Any]:
        make_pod(cluster, name, {"ai.compute/vram": vram}, namespace=ns)
        pod = cluster.wait_pod(name, namespace=ns, timeout=60)
        assert pod["spec"].get("nodeName"), unschedulable_message(pod)
        return pod

    first = bound("first", "8Gi")
    bound("second", "4Gi")
    settled(12)
    # A pod placed past the scheduler, carrying a copy of another pod's assignment: hcsd
    # refuses it (not its uid), so it holds nothing and must not count. The admission policy
    # would refuse the pod; the extender must not depend on it (a cluster without it, a pod
    # made before it was installed), so it is out of the way for this one create.
    binding = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/"
    policy = cluster.kube.get(binding + "hcs-assignment-annotation")
    cluster.kube.request("DELETE", binding + "hcs-assignment-annotation")
    copy = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "copied", "namespace": ns,
                     "annotations": {ANNOTATION: first["metadata"]["annotations"][ANNOTATION]}},
        "spec": {"nodeName": first["spec"]["nodeName"],
                 "containers": [{"name": "main", "image": "busybox"}]},
    }  # fmt: skip
    wait_for(lambda: created(cluster, f"/api/v1/namespaces/{ns}/pods", copy),
             "the copy is created without the policy")  # fmt: skip
    for field in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
        policy["metadata"].pop(field, None)
    cluster.kube.create(binding.rstrip("/"), policy)
    cluster.stop_extender()
    cluster.delete_pod("second", ns)  # while the extender is away: no event reaches it
    cluster.start_extender()
    settled(8)
    cluster.delete_pod("first", ns)
    bound("first", "2Gi")  # the same name again, a new pod
    settled(2)
    cluster.stop_extender()
    cluster.delete_pod("first", ns)
    cluster.start_extender()
    settled(0)
    bound("second", "16Gi")
    settled(16)
    for name in ("second", "copied"):
        cluster.delete_pod(name, ns)
