"""The mutating webhook: which pods get `spec.schedulerName`, and what a malformed body gets.

The decision (hcsd/cluster/webhook.py) over tables of pods; the server (webhook_server.py)
over a real socket: a review answered, a malformed one refused with 400 and the reason, an
oversized one with 413 unread, and the process still serving afterwards.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hcsd.cluster.httpserver import Limits
from hcsd.cluster.webhook import ReviewError, Rule, review
from hcsd.cluster.webhook_server import WEBHOOK_LIMITS, main, serve_webhook
from tests.harness.waiting import wait_for

RULE = Rule("hcs-scheduler")
CHART = Path(__file__).resolve().parents[2] / "packaging" / "helm" / "hcs"


def pod(
    *,
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    scheduler: str | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers or [{"name": "main", "image": "busybox"}]}
    if init is not None:
        spec["initContainers"] = init
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"labels": labels or {}}, "spec": spec}


def asking(field: str, resource: str = "ai.compute/vram") -> dict[str, Any]:
    return {"name": "main", "image": "x", "resources": {field: {resource: "16Gi"}}}


def request_for(obj: Any, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0f6b1c7e-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "object": obj,
            **extra,
        },
    }


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]] | None:
    response = answer["response"]
    assert response["uid"] == "0f6b1c7e-1" and response["allowed"] is True
    if "patch" not in response:
        return None
    assert response["patchType"] == "JSONPatch"
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return patch


SET = [{"op": "add", "path": "/spec/schedulerName", "value": "hcs-scheduler"}]

CASES = {
    "vram in limits": (pod(containers=[asking("limits")]), SET),
    "vram in requests": (pod(containers=[asking("requests")]), SET),
    "devices": (pod(containers=[asking("limits", "ai.compute/devices")]), SET),
    "tflops": (pod(containers=[asking("limits", "ai.compute/tflops-fp16")]), SET),
    "an init container": (pod(init=[asking("limits")]), SET),
    "the second container": (
        pod(containers=[{"name": "a", "image": "x"}, asking("limits")]),
        SET,
    ),
    "default-scheduler named": (
        pod(containers=[asking("limits")], scheduler="default-scheduler"),
        SET,
    ),
    "empty scheduler name": (pod(containers=[asking("limits")], scheduler=""), SET),
    "a plain pod": (pod(), None),
    "cpu and memory only": (
        pod(containers=[{"name": "m", "image": "x", "resources": {"limits": {"cpu": "1"}}}]),
        None,
    ),
    "another vendor's resource": (pod(containers=[asking("limits", "nvidia.com/gpu")]), None),
    "a look-alike prefix": (pod(containers=[asking("limits", "ai.computer/vram")]), None),
    "its own scheduler": (pod(containers=[asking("limits")], scheduler="volcano"), None),
    "already hcs-scheduler": (pod(containers=[asking("limits")], scheduler="hcs-scheduler"), None),
    "opted out": (pod(containers=[asking("limits")], labels={"hcs.io/webhook": "disabled"}), None),
    "another label value": (
        pod(containers=[asking("limits")], labels={"hcs.io/webhook": "enabled"}),
        SET,
    ),
}


@pytest.mark.parametrize(("obj", "expected"), CASES.values(), ids=list(CASES))
def test_which_pods_are_sent_to_hcs_scheduler(obj: dict[str, Any], expected: Any) -> None:
    assert patch_of(review(json.dumps(request_for(obj)).encode(), RULE)) == expected


def test_the_scheduler_name_is_configurable() -> None:
    body = json.dumps(request_for(pod(containers=[asking("limits")]))).encode()
    (op,) = patch_of(review(body, Rule("gpu-scheduler"))) or []
    assert op["value"] == "gpu-scheduler"


@pytest.mark.parametrize(
    ("where", "name"), [("annotations", "x" * 100_000), ("labels", "a" * 64), ("annotations", "A")]
)
def test_a_bad_job_name_is_refused_without_echoing_it(where: str, name: str) -> None:
    obj = pod(containers=[asking("limits")])
    obj["metadata"][where] = {"hcs.io/job": name}
    response = review(json.dumps(request_for(obj)).encode(), RULE)["response"]
    assert response["allowed"] is False and "patch" not in response
    message = response["status"]["message"]
    assert message.startswith("hcs.io/job (") and "DNS-1123 label" in message
    assert name not in message and len(message) < 200


def test_a_good_job_name_and_pods_not_for_hcs_pass() -> None:
    good = pod(containers=[asking("limits")])
    good["metadata"]["annotations"] = {"hcs.io/job": "train-7"}
    assert patch_of(review(json.dumps(request_for(good)).encode(), RULE)) == SET
    plain = pod()
    plain["metadata"]["annotations"] = {"hcs.io/job": "x" * 1000}  # not HCS's pod: untouched
    assert patch_of(review(json.dumps(request_for(plain)).encode(), RULE)) is None


UNTOUCHED = {
    "an update": {"operation": "UPDATE"},
    "a subresource": {"subResource": "ephemeralcontainers"},
    "not a pod": {"kind": {"group": "apps", "version": "v1", "kind": "Deployment"}},
}


@pytest.mark.parametrize("extra", UNTOUCHED.values(), ids=list(UNTOUCHED))
def test_only_pod_creation_is_changed(extra: dict[str, Any]) -> None:
    body = json.dumps(request_for(pod(containers=[asking("limits")]), **extra)).encode()
    assert patch_of(review(body, RULE)) is None


MALFORMED = {
    "not json": (b"{not json", "not JSON"),
    "not utf-8": (b"\xff\xfe", "not JSON"),
    "a list": (b"[]", "the body is not an object"),
    "another kind": (
        json.dumps({"apiVersion": "v1", "kind": "Pod"}).encode(),
        "not an AdmissionReview admission.k8s.io/v1",
    ),
    "v1beta1": (
        json.dumps({**request_for(pod()), "apiVersion": "admission.k8s.io/v1beta1"}).encode(),
        "not an AdmissionReview",
    ),
    "no request": (
        json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
        "request is not an object",
    ),
    "no uid": (
        json.dumps({**request_for(pod()), "request": {"operation": "CREATE"}}).encode(),
        "request.uid is missing",
    ),
    "no object": (json.dumps(request_for(None)).encode(), "request.object is not an object"),
    "no spec": (
        json.dumps(request_for({"metadata": {}})).encode(),
        "request.object.spec is not an object",
    ),
    "containers not a list": (
        json.dumps(request_for({"spec": {"containers": {"a": 1}}})).encode(),
        "spec.containers is not a list",
    ),
    "a container not an object": (
        json.dumps(request_for({"spec": {"containers": ["main"]}})).encode(),
        "spec.containers[0] is not an object",
    ),
    "limits not an object": (
        json.dumps(
            request_for({"spec": {"containers": [{"resources": {"limits": [1]}}]}})
        ).encode(),
        "spec.containers[0].resources.limits is not an object",
    ),
    "labels not an object": (
        json.dumps(request_for({"metadata": {"labels": "x"}, "spec": {}})).encode(),
        "request.object.metadata.labels is not an object",
    ),
    "schedulerName not a string": (
        json.dumps(request_for({"spec": {"schedulerName": 5, "containers": []}})).encode(),
        "schedulerName is not a string",
    ),
}


@pytest.mark.parametrize(("body", "reason"), MALFORMED.values(), ids=list(MALFORMED))
def test_a_malformed_review_is_refused_with_its_reason(body: bytes, reason: str) -> None:
    with pytest.raises(ReviewError, match=re.escape(reason)):
        review(body, RULE)


# --- the server, over a real socket ----------------------------------------------------------


@pytest.fixture
def server() -> Iterator[tuple[str, int]]:
    served = serve_webhook("127.0.0.1", 0, None, RULE, Limits(max_body=64 * 1024))
    thread = threading.Thread(target=served.serve_forever, daemon=True)
    thread.start()
    yield "127.0.0.1", served.server_address[1]
    served.shutdown()
    served.server_close()


def post(address: tuple[str, int], body: bytes, path: str = "/mutate") -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(*address, timeout=5)
    try:
        connection.request("POST", path, body, {"Content-Type": "application/json"})
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def test_the_server_answers_a_review_and_refuses_malformed_ones(server: tuple[str, int]) -> None:
    status, body = post(
        server, json.dumps(request_for(pod(containers=[asking("limits")]))).encode()
    )
    assert status == 200
    assert patch_of(json.loads(body)) == SET
    status, body = post(server, b"{not json")
    assert status == 400 and body.startswith(b"not an AdmissionReview: the body is not JSON")
    status, body = post(server, b"x" * (64 * 1024 + 1))
    assert status == 413
    status, _ = post(server, b"{}", path="/other")
    assert status == 404
    # Still serving after each refusal.
    status, body = post(server, json.dumps(request_for(pod())).encode())
    assert status == 200 and patch_of(json.loads(body)) is None
    connection = http.client.HTTPConnection(*server, timeout=5)
    connection.request("GET", "/healthz")
    assert connection.getresponse().status == 200
    connection.close()


def raw_request(address: tuple[str, int], request: bytes) -> bytes:
    """The server's whole answer to bytes sent as they are (http.client would refuse them)."""
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("length", ["²".encode(), "١٢".encode(), b"+2", b"0x2", b"1_0"])
def test_a_content_length_that_is_not_ascii_digits_is_refused(
    server: tuple[str, int], length: bytes
) -> None:
    """'²'.isdigit() is True and int('²') raises: the handler must answer, not die."""
    answer = raw_request(
        server, b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n{}"
    )
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:80]
    assert b"Content-Length must be a decimal number" in answer
    status, _ = post(server, json.dumps(request_for(pod())).encode())
    assert status == 200


def test_a_listen_port_that_is_not_ascii_digits_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--listen", "0.0.0.0:8²", "--tls-cert", "c", "--tls-key", "k"])
    assert stopped.value.code == 2


# --- what one caller can take ----------------------------------------------------------------

SERVE = """
from hcsd.cluster.webhook import Rule
from hcsd.cluster.webhook_server import serve_webhook
served = serve_webhook("127.0.0.1", 0, None, Rule())
print(served.server_address[1], flush=True)
served.serve_forever()
"""


def chart_memory_limit() -> int:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    limit = values["webhook"]["resources"]["limits"]["memory"]
    assert limit.endswith("Mi")
    return int(limit[:-2]) * 1024 * 1024


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_flood_of_the_costliest_bodies_stays_under_the_charts_memory_limit() -> None:
    """3 MiB of `[{},{},...]` parses into ~120 MiB of Python objects: the process's peak,
    measured, is bounded by the review slots, whatever number of callers send it at once."""
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert process.stdout is not None
        address = ("127.0.0.1", int(process.stdout.readline()))
        count = (WEBHOOK_LIMITS.max_body - 2) // 3
        costly = b"[" + b"{}," * (count - 1) + b"{}]"
        answers: list[bytes] = []

        def send(source: str, body: bytes) -> None:
            with socket.create_connection(address, timeout=60, source_address=(source, 0)) as sock:
                head = f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
                sock.sendall(head.encode() + body)
                answers.append(sock.recv(64 * 1024))

        senders = [
            threading.Thread(target=send, args=(f"127.0.0.{i}", costly)) for i in range(2, 8)
        ]
        senders.append(threading.Thread(target=send, args=("127.0.1.1", costly + b" " * 1024)))
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        statuses = sorted(answer.split(b" ", 2)[1] for answer in answers)
        assert b"413" in statuses and all(s in (b"400", b"413", b"503") for s in statuses)
        assert statuses.count(b"400") >= 2  # some were parsed, and refused for what they are
        peak = peak_rss(process.pid)
        assert peak < chart_memory_limit(), f"peak RSS {peak >> 20} MiB"
    finally:
        process.kill()
        process.wait()


def hold(address: tuple[str, int], source: str, request: bytes) -> socket.socket:
    sock = socket.create_connection(address, timeout=5, source_address=(source, 0))
    sock.sendall(request)
    return sock


# A request announcing a body it never sends: it holds a review slot until the read deadline.
STALLED = b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"


def test_one_address_filling_its_share_starves_no_other() -> None:
    """Two addresses at their connection limit (past it before: 2 x 32 was every connection),
    the first also stalling a review in its slot: a third is still answered at once."""
    served = serve_webhook("127.0.0.1", 0, None, RULE)
    threading.Thread(target=served.serve_forever, daemon=True).start()
    address = ("127.0.0.1", served.server_address[1])
    held: list[socket.socket] = []
    try:
        for source, request in (("127.0.0.2", STALLED), ("127.0.0.3", b"")):
            held += [
                hold(address, source, request) for _ in range(WEBHOOK_LIMITS.max_per_client + 4)
            ]
        # each refusal is counted when the server's loop reaches that connection
        wait_for(lambda: served.refused["client"] >= 8, "the 8 over the share refused", timeout=10)
        assert served.refused["client"] == 8
        connection = http.client.HTTPConnection(*address, timeout=5)
        started = time.monotonic()
        connection.request("POST", "/mutate", json.dumps(request_for(pod())).encode())
        assert connection.getresponse().status == 200
        assert time.monotonic() - started < 3.0  # not after the stalled review's read deadline
        connection.close()
    finally:
        for sock in held:
            sock.close()
        served.shutdown()
        served.server_close()
