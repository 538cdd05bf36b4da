"""The extender's HTTP layer: kube-scheduler's wire format over a real socket, and what it
does with bodies and methods kube-scheduler never sends."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from hcsd.cluster.extender import Extender
from hcsd.cluster.http import MAX_BODY, Limits, serve
from hcsd.cluster.kube import Kube
from hcsd.contract.keyring import Keyring
from hcsd.profiles.database import ProfileDatabase
from tests.unit.fleet import add_node, beat, pod

DB = ProfileDatabase.load(None)
LIMIT = 64 * 1024  # the test server's body limit


def KEYS() -> Keyring:
    return Keyring({"k": b"k" * 32}, "k")


class Served:
    def __init__(self, *, leader: bool = True, max_body: int = LIMIT) -> None:
        self.leader = leader
        self.extender = Extender(Kube.__new__(Kube), KEYS, DB, is_leader=lambda: self.leader)
        for name in ("node-a", "node-b"):
            add_node(self.extender, name)
            beat(self.extender, name)
        self.server = serve(self.extender, "127.0.0.1", 0, limits=Limits(max_body=max_body))
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.close()


def call(
    connection: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    connection.request(method, path, body, headers)
    response = connection.getresponse()
    return response.status, dict(response.getheaders()), response.read()


def post(connection: http.client.HTTPConnection, path: str, value: Any) -> tuple[int, Any]:
    status, _, data = call(connection, "POST", path, json.dumps(value).encode())
    return status, json.loads(data)


GOOD = {"Pod": pod({"ai.compute/vram": "16Gi"}), "NodeNames": ["node-a", "node-b", "node-c"]}


def test_the_three_verbs_in_kube_schedulers_shapes_on_one_connection(served: Served) -> None:
    connection = served.connect()
    status, answer = post(connection, "/filter", GOOD)
    assert status == 200
    assert answer == {
        "Nodes": None,
        "NodeNames": ["node-a", "node-b"],
        "FailedNodes": {"node-c": "node has no ComputeNode (is hcs-syncer running on it?)"},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    status, scores = post(connection, "/prioritize", {**GOOD, "NodeNames": ["node-a"]})
    assert status == 200 and [s["Host"] for s in scores] == ["node-a"]
    assert 0 < scores[0]["Score"] <= 10
    # The names of Nodes.items when NodeNames is absent (nodeCacheCapable: false).
    by_items = {"Pod": GOOD["Pod"], "Nodes": {"items": [{"metadata": {"name": "node-b"}}]}}
    assert post(connection, "/scheduler/filter", by_items)[1]["NodeNames"] == ["node-b"]
    served.leader = False
    bind = {"PodName": "p", "PodNamespace": "ns", "PodUID": "u1", "Node": "node-a"}
    assert post(connection, "/bind", bind) == (
        200,
        {"Error": "this hcs-scheduler-extender replica is not the leader"},
    )
    connection.close()


def test_prioritize_writes_any_node_name_as_valid_json(served: Served) -> None:
    names = ["node-a", 'odd "name"\\', "名前"]
    status, scores = post(served.connect(), "/prioritize", {**GOOD, "NodeNames": names})
    assert status == 200 and [s["Host"] for s in scores] == names


@pytest.mark.parametrize(
    ("path", "body", "status", "error"),
    [
        # Filter and prioritize bodies are read by orjson, and say so in its words.
        ("/filter", b"{not json", 400, "bad request body: unexpected character"),
        ("/filter", b'{"Pod": "\xff"}', 400, "bad request body: str is not valid UTF-8"),
        ("/bind", b"{not json", 400, "bad request body: Expecting property name"),
        ("/filter", b"[1, 2]", 400, "bad request body: the body must be a JSON object"),
        ("/filter", b'{"Pod": "p"}', 400, "bad request body: Pod must be an object"),
        ("/filter", b'{"Pod": {"metadata": "m"}}', 400, "Pod.metadata must be an object"),
        ("/filter", b'{"NodeNames": "node-a"}', 400, "NodeNames must be a list of strings"),
        ("/prioritize", b'{"NodeNames": [1]}', 400, "NodeNames must be a list of strings"),
        ("/filter", b'{"Nodes": {"items": [{}]}}', 400, "Nodes.items[] must have metadata.name"),
        ("/filter", b'{"Nodes": {"items": 3}}', 400, "Nodes.items must be a list"),
        ("/bind", b'{"PodUID": 7}', 400, "bad request body: PodUID must be a string"),
        # Valid envelopes, a pod no API server would store: an error, not a lost connection.
        ("/filter", b'{"Pod": {"spec": "x"}, "NodeNames": ["node-a"]}', 500, "filter failed"),
    ],
    ids=[
        "not-json",
        "not-utf8",
        "bind-not-json",
        "not-an-object",
        "pod-not-an-object",
        "metadata-not-an-object",
        "names-not-a-list",
        "names-not-strings",
        "items-without-names",
        "items-not-a-list",
        "bind-uid-not-a-string",
        "pod-spec-not-an-object",
    ],
)
def test_a_malformed_body_gets_its_reason_and_the_connection_lives_on(
    served: Served, path: str, body: bytes, status: int, error: str
) -> None:
    connection = served.connect()
    got, headers, data = call(connection, "POST", path, body)
    assert got == status and error in json.loads(data)["Error"]
    assert "Connection" not in headers  # the body was read: the next request can follow
    assert post(connection, "/filter", GOOD)[0] == 200


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("GET", "/filter", 405, "POST"),
        ("PUT", "/bind", 405, "POST"),
        ("DELETE", "/prefix/prioritize", 405, "POST"),
        ("POST", "/healthz", 405, "GET"),
        ("PATCH", "/metrics", 405, "GET"),
        ("POST", "/preempt", 404, None),
        ("GET", "/nothing", 404, None),
        ("DELETE", "/nothing", 404, None),
    ],
)
def test_wrong_methods_and_unknown_paths(
    served: Served, method: str, path: str, status: int, allow: str | None
) -> None:
    got, headers, _ = call(served.connect(), method, path, b"{}" if method != "GET" else None)
    assert got == status and headers.get("Allow") == allow


def raw_request(port: int, head: bytes, body: bytes = b"") -> tuple[bytes, bytes]:
    """(the answer, what the server sent after it before closing) on a raw socket."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + body)
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(65536)
        header, _, rest = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in header.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))  # fmt: skip
        while len(rest) < length:
            rest += s.recv(65536)
        after = b""
        try:
            while chunk := s.recv(65536):
                after += chunk
        except TimeoutError:
            after = b"<still open>"
        return header + b"\r\n\r\n" + rest[:length], after


def test_a_body_over_the_limit_is_refused_unread_and_the_connection_closed() -> None:
    served = Served()  # LIMIT
    try:
        head = (f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {LIMIT + 1}\r\n\r\n").encode()
        answer, after = raw_request(served.port, head)  # the body is never sent
        assert answer.startswith(b"HTTP/1.1 413") and b"Connection: close" in answer
        assert f"a body of {LIMIT + 1} bytes is over the limit of {LIMIT}".encode() in answer
        assert after == b""  # closed: no half-read body is taken for the next request
        no_length = raw_request(served.port, b"POST /filter HTTP/1.1\r\nHost: x\r\n\r\n")[0]
        assert no_length.startswith(b"HTTP/1.1 400") and b"(Content-Length)" in no_length
        assert served.server.refused["body"] == 1
        padded = json.dumps(GOOD).encode()
        padded += b" " * (LIMIT - len(padded))  # exactly at the limit: served
        status, _, data = call(served.connect(), "POST", "/filter", padded)
        assert status == 200 and json.loads(data)["NodeNames"] == ["node-a", "node-b"]
    finally:
        served.close()


def test_the_default_limit_is_checked_before_reading() -> None:
    default = Served(max_body=MAX_BODY)
    try:
        head = f"POST /bind HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n"
        answer, _ = raw_request(default.port, head.encode())
        assert answer.startswith(b"HTTP/1.1 413")
        assert MAX_BODY == 4 * 1024 * 1024  # a few MiB: a pod and thousands of node names
    finally:
        default.close()


def test_probes_and_metrics(served: Served) -> None:
    connection = served.connect()
    assert call(connection, "GET", "/healthz")[0] == 200
    assert call(connection, "GET", "/readyz")[0] == 503  # caches not synced yet
    served.server.ready = True
    assert call(connection, "GET", "/readyz")[:1] == (200,)
    served.leader = False
    status, _, text = call(connection, "GET", "/readyz")
    assert (status, text) == (503, b"not leading\n")
    post(connection, "/filter", GOOD)
    metrics = call(connection, "GET", "/metrics")[2].decode()
    assert 'hcs_extender_requests_total{verb="filter"} 1' in metrics
    assert 'hcs_extender_refusals_total{reason="unfit"} 1' in metrics
    assert "hcs_extender_compute_nodes 2.0" in metrics and "hcs_extender_leader 0.0" in metrics
    connection.request("GET", "/metrics", headers={"Accept": OPENMETRICS})
    response = connection.getresponse()
    text = response.read().decode()
    assert response.getheader("Content-Type", "").startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n")
    assert 'hcs_extender_requests_total{verb="filter"} 1.0' in text
    assert "# TYPE hcs_extender_requests counter" in text  # OpenMetrics names the family bare


OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
