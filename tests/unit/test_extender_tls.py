"""The extender's transport: mutual TLS on the scheduling port, the allowed client names,
plain probes apart, and the limits on connections and slow requests (over real sockets, with
certificates made by openssl as the cluster suite makes them)."""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hcsd.cluster.commands import extender_main
from hcsd.cluster.endpoints import add_flags, open_endpoints, settings_from
from hcsd.cluster.extender import Extender
from hcsd.cluster.http import ExtenderServer, serve
from hcsd.cluster.httpserver import Limits
from hcsd.cluster.kube import Kube
from hcsd.cluster.tls import TLSSetupError, server_context
from hcsd.profiles.database import ProfileDatabase
from tests.cluster.controlplane import CLIENTS, make_certs
from tests.unit.fleet import add_node, beat, pod

DB = ProfileDatabase.load(None)
FILTER = json.dumps({"Pod": pod({"ai.compute/vram": "16Gi"}), "NodeNames": ["node-a"]})


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    make_certs(directory, {"scheduler": CLIENTS["scheduler"], "admin": CLIENTS["admin"]})
    return directory


def start(server: ExtenderServer) -> ExtenderServer:
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


@pytest.fixture
def extender() -> Extender:
    e = Extender(Kube.__new__(Kube), b"k" * 32, DB)
    add_node(e, "node-a")
    beat(e, "node-a")
    return e


@pytest.fixture
def secured(certs: Path, extender: Extender) -> Iterator[ExtenderServer]:
    tls = server_context(
        str(certs / "extender-serving.crt"), str(certs / "extender-serving.key"),
        str(certs / "ca.crt"),
    )  # fmt: skip
    server = start(serve(extender, "127.0.0.1", 0, tls=tls, probes=False,
                         allowed_clients=frozenset({"system:kube-scheduler"})))  # fmt: skip
    yield server
    server.shutdown()
    server.server_close()


def client(certs: Path, port: int, who: str | None) -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    if who is not None:
        context.load_cert_chain(str(certs / f"{who}.crt"), str(certs / f"{who}.key"))
    return http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)


def post(connection: http.client.HTTPConnection, path: str, body: str) -> tuple[int, bytes]:
    connection.request("POST", path, body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, response.read()


def test_kube_schedulers_certificate_is_served(certs: Path, secured: ExtenderServer) -> None:
    connection = client(certs, secured.server_address[1], "scheduler")
    status, data = post(connection, "/filter", FILTER)
    assert status == 200 and json.loads(data)["NodeNames"] == ["node-a"]
    status, data = post(connection, "/filter", "[1, 2]")  # the connection lives on
    assert status == 400 and b"must be a JSON object" in data
    connection.close()


def test_a_client_without_a_certificate_is_refused_at_the_handshake(
    certs: Path, secured: ExtenderServer
) -> None:
    connection = client(certs, secured.server_address[1], None)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        post(connection, "/filter", FILTER)  # TLS 1.3: the refusal comes with the first read
    assert secured.refused["tls"] == 1
    assert secured.extender.metrics.requests["filter"] == 0  # nothing of it was read


def test_a_certificate_of_another_name_gets_403(certs: Path, secured: ExtenderServer) -> None:
    connection = client(certs, secured.server_address[1], "admin")  # same CA, CN hcs-admin
    status, data = post(connection, "/bind", json.dumps({"PodUID": "u"}))
    assert status == 403
    assert json.loads(data)["Error"] == "client 'hcs-admin' is not allowed to call the extender"
    assert secured.extender.metrics.requests["bind"] == 0


def test_probes_are_plain_and_apart(certs: Path, extender: Extender) -> None:
    probes = start(serve(extender, "127.0.0.1", 0, scheduling=False))
    try:
        plain = http.client.HTTPConnection("127.0.0.1", probes.server_address[1], timeout=10)
        plain.request("GET", "/healthz")
        assert plain.getresponse().read() == b"ok\n"
        assert post(plain, "/filter", FILTER)[0] == 404  # no verbs on the probe port
        plain.request("GET", "/metrics")
        metrics = plain.getresponse().read().decode()
        assert 'hcs_extender_connections_refused_total{port="' in metrics
    finally:
        probes.shutdown()
        probes.server_close()


def test_unusable_tls_files_say_which(tmp_path: Path, certs: Path) -> None:
    with pytest.raises(TLSSetupError, match="failed to load the serving certificate"):
        server_context(str(tmp_path / "none.crt"), str(tmp_path / "none.key"))
    with pytest.raises(TLSSetupError, match="failed to load the client CA"):
        server_context(
            str(certs / "extender-serving.crt"), str(certs / "extender-serving.key"),
            str(tmp_path / "none.crt"),
        )  # fmt: skip


def test_a_slow_request_is_cut_off_and_others_are_served(extender: Extender) -> None:
    """Slowloris: a byte every 0.2 s never ends a request; the read deadline does."""
    server = start(serve(extender, "127.0.0.1", 0, limits=Limits(read_timeout=1.0)))
    port = server.server_address[1]
    try:
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
            closed = False
            for byte in b"POST /filter HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 100:
                try:
                    slow.sendall(bytes([byte]))
                except OSError:
                    closed = True
                    break
                fast = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                assert post(fast, "/filter", FILTER)[0] == 200  # served meanwhile
                fast.close()
                time.sleep(0.2)
                if time.monotonic() - started > 5:
                    break
            if not closed:
                slow.settimeout(5)
                assert slow.recv(1024) == b""  # the server gave up on it
        assert time.monotonic() - started < 5
    finally:
        server.shutdown()
        server.server_close()


def test_connections_over_the_cap_are_closed_and_counted(extender: Extender) -> None:
    server = start(serve(extender, "127.0.0.1", 0, limits=Limits(max_connections=2)))
    port = server.server_address[1]
    try:
        held = [http.client.HTTPConnection("127.0.0.1", port, timeout=10) for _ in range(2)]
        for connection in held:  # each holds a serving thread while it stays open
            assert post(connection, "/filter", FILTER)[0] == 200
        with socket.create_connection(("127.0.0.1", port), timeout=10) as third:
            third.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert third.recv(1024) == b""  # closed unserved
        assert server.refused["connections"] == 1
        held[0].close()

        def served() -> bool:
            fresh = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                return post(fresh, "/filter", FILTER)[0] == 200
            except (ConnectionError, http.client.HTTPException):
                return False
            finally:
                fresh.close()

        deadline = time.monotonic() + 10
        while not served():  # the slot comes back when the server notices the close
            assert time.monotonic() < deadline, "a closed connection's slot never came back"
            time.sleep(0.05)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        ([], "--tls-cert, --tls-key and --tls-client-ca are required"),
        (["--tls-cert", "c", "--tls-key", "k"], "--tls-client-ca are required"),
        (["--insecure-plain-http", "--tls-cert", "c"], "exclude each other"),
    ],
    ids=["nothing", "no-client-ca", "both"],
)
def test_the_verbs_need_mutual_tls_or_the_insecure_flag(
    flags: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before anything starts (the key file is not even read)."""
    with pytest.raises(SystemExit) as stopped:
        extender_main(["--keys-dir", "/nonexistent", *flags])
    assert stopped.value.code == 2 and error in capsys.readouterr().err


def test_plain_http_is_said_loudly(extender: Extender, caplog: pytest.LogCaptureFixture) -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    args = parser.parse_args(
        ["--insecure-plain-http", "--listen", "127.0.0.1:0", "--probe-listen", "127.0.0.1:0"]
    )
    with caplog.at_level(logging.WARNING):
        endpoints = open_endpoints(extender, settings_from(args, parser))
    try:
        assert "INSECURE: --insecure-plain-http" in caplog.text
        scheduling, probes = endpoints.servers
        assert scheduling.scheduling and not scheduling.probes
        assert probes.probes and not probes.scheduling
    finally:
        for server in endpoints.servers:
            server.server_close()
