"""The extender's transport: mutual TLS on the scheduling port, the allowed client names,
plain probes apart, and the limits on connections and slow requests (over real sockets, with
certificates made by openssl as the cluster suite makes them)."""

from __future__ import annotations

import argparse
import contextlib
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
from hcsd.cluster.endpoints import Endpoints, add_flags, open_endpoints, settings_from
from hcsd.cluster.extender import Extender
from hcsd.cluster.http import ExtenderServer, serve
from hcsd.cluster.httpserver import Limits
from hcsd.cluster.kube import Kube
from hcsd.cluster.node_keys import NodeKeys
from hcsd.cluster.node_keys_http import serve_node_keys
from hcsd.cluster.tls import CertificateFiles, TLSSetupError, server_context
from hcsd.contract.keyring import Keyring
from hcsd.profiles.database import ProfileDatabase
from tests.cluster.controlplane import CLIENTS, _sign, make_certs
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
    e = Extender(Kube.__new__(Kube), lambda: Keyring({"k": b"k" * 32}, "k"), DB)
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
    deadline = time.monotonic() + 10  # counted after the alert is sent
    while secured.refused["tls"] != 1:
        assert time.monotonic() < deadline, secured.refused
        time.sleep(0.02)
    assert (
        secured.extender.metrics.value("hcs_extender_requests_total", verb="filter") == 0
    )  # nothing of it was read


def test_a_certificate_of_another_name_gets_403(certs: Path, secured: ExtenderServer) -> None:
    connection = client(certs, secured.server_address[1], "admin")  # same CA, CN hcs-admin
    status, data = post(connection, "/bind", json.dumps({"PodUID": "u"}))
    assert status == 403
    assert json.loads(data)["Error"] == "client 'hcs-admin' is not allowed to call the extender"
    assert secured.extender.metrics.value("hcs_extender_requests_total", verb="bind") == 0


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


def test_unusable_tls_files_end_the_command_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Said by the command (endpoints raises; only the entry point prints and exits)."""
    missing = [str(tmp_path / name) for name in ("tls.crt", "tls.key", "ca.crt")]
    flags = ["--tls-cert", missing[0], "--tls-key", missing[1], "--tls-client-ca", missing[2]]
    assert extender_main(["--keys-dir", "/nonexistent", *flags]) == 2
    assert "failed to load the serving certificate" in capsys.readouterr().err


def test_plain_http_is_said_loudly(extender: Extender, caplog: pytest.LogCaptureFixture) -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    args = parser.parse_args(
        ["--insecure-plain-http", "--listen", "127.0.0.1:0", "--probe-listen", "127.0.0.1:0"]
    )
    with caplog.at_level(logging.WARNING):
        endpoints = open_endpoints(extender, settings_from(args))
    try:
        assert "INSECURE: --insecure-plain-http" in caplog.text
        scheduling, probes = endpoints.servers
        assert scheduling.scheduling and not scheduling.probes
        assert probes.probes and not probes.scheduling
    finally:
        for server in endpoints.servers:
            server.server_close()


# --- limits on what a client can hold -------------------------------------------------------


def plain(server: ExtenderServer, source: str = "127.0.0.1") -> socket.socket:
    """A raw connection to `server` from `source` (any 127/8 address on Linux)."""
    sock = socket.socket()
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect(server.server_address[:2])
    return sock


def closed_within(sock: socket.socket, seconds: float) -> float:
    """How long until the server closed `sock` (it sends nothing first)."""
    started = time.monotonic()
    sock.settimeout(seconds + 5)
    with contextlib.suppress(ConnectionResetError):
        assert sock.recv(1024) == b""
    return time.monotonic() - started


@pytest.fixture
def limited(extender: Extender, request: pytest.FixtureRequest) -> Iterator[ExtenderServer]:
    server = start(serve(extender, "127.0.0.1", 0, limits=request.param))
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("limited", [Limits(read_timeout=1.0, idle_timeout=30.0)], indirect=True)
def test_a_silent_connection_gets_the_read_timeout_not_the_idle_one(
    limited: ExtenderServer,
) -> None:
    """The first request's clock starts at the connection: a client that sends nothing
    holds its slot for read_timeout, not idle_timeout."""
    with plain(limited) as silent:
        assert closed_within(silent, 1.0) < 3.0
    kept = http.client.HTTPConnection("127.0.0.1", limited.server_address[1], timeout=10)
    assert post(kept, "/filter", FILTER)[0] == 200
    time.sleep(1.5)  # idle between requests: the idle timeout, longer
    assert post(kept, "/filter", FILTER)[0] == 200
    kept.close()


@pytest.mark.parametrize(
    "limited", [Limits(max_connections=4, max_per_client=2, read_timeout=10.0)], indirect=True
)
def test_one_client_cannot_take_every_slot(limited: ExtenderServer) -> None:
    held = [plain(limited) for _ in range(2)]
    try:
        with plain(limited) as third:
            assert closed_within(third, 1.0) < 1.0  # closed unserved, at once
        other = plain(limited, "127.0.0.2")  # another address still gets in
        other.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert other.recv(1024).startswith(b"HTTP/1.1 200")
        other.close()
        assert limited.refused["client"] == 1
    finally:
        for sock in held:
            sock.close()


def headers(count: int, size: int) -> bytes:
    return b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * size) for i in range(count))


@pytest.mark.parametrize("limited", [Limits()], indirect=True)
@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET /healthz HTTP/1.1\r\n" + headers(7, 4000), b"200"),
        (b"GET /healthz HTTP/1.1\r\n" + headers(1, 9000), b"431"),  # one line over 8 KiB
        (b"GET /healthz HTTP/1.1\r\n" + headers(9, 4000), b"431"),  # over 32 KiB in all
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n", b"414"),
    ],
    ids=["under", "long-line", "over-in-all", "request-line"],
)
def test_request_headers_are_capped(limited: ExtenderServer, head: bytes, status: bytes) -> None:
    with plain(limited) as sock:
        sock.sendall(head + b"\r\n")
        assert sock.recv(1024).split(b" ")[1] == status
    deadline = time.monotonic() + 10  # counted after the answer
    while limited.refused["headers"] != (status != b"200"):
        assert time.monotonic() < deadline, limited.refused
        time.sleep(0.02)


def test_the_node_keys_port_caps_headers_too() -> None:
    """Every node can reach it: the same header flood would fill the extender there."""
    server = serve_node_keys(NodeKeys.__new__(NodeKeys), "127.0.0.1", 0, cert="", key="",
                             plain_http=True)  # fmt: skip
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        with socket.create_connection(server.server_address[:2], timeout=10) as sock:
            sock.sendall(b"GET /node-keys HTTP/1.1\r\n" + headers(1, 9000) + b"\r\n")
            assert sock.recv(1024).split(b" ")[1] == b"431"
    finally:
        server.shutdown()
        server.server_close()


def test_a_node_keys_failure_answers_500_without_its_detail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every node can reach the port: an exception's text (paths, state) stays in the log."""
    server = serve_node_keys(
        NodeKeys.__new__(NodeKeys), "127.0.0.1", 0, cert="", key="", plain_http=True
    )  # fmt: skip  (no attributes: answer() fails)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        connection = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
        connection.request("GET", "/node-keys", headers={"Authorization": "Bearer t"})
        response = connection.getresponse()
        assert (response.status, response.read()) == (
            500,
            b"node keys failed: see the extender's log\n",
        )
        assert "AttributeError" in caplog.text
    finally:
        server.shutdown()
        server.server_close()


def test_the_node_keys_port_uses_the_shared_tls_and_its_refusals_show_in_metrics(
    certs: Path, extender: Extender
) -> None:
    """Its context is tls.server_context's (no renegotiation), reloaded like the scheduling
    port's; a failed handshake there is counted in the other ports' /metrics."""
    keys = serve_node_keys(NodeKeys.__new__(NodeKeys), "127.0.0.1", 0,
                           cert=str(certs / "extender-serving.crt"),
                           key=str(certs / "extender-serving.key"))  # fmt: skip
    assert isinstance(keys.tls, CertificateFiles)
    assert keys.tls().options & ssl.OP_NO_RENEGOTIATION
    probes = start(serve(extender, "127.0.0.1", 0, scheduling=False))
    Endpoints([probes]).count_too(keys)
    threading.Thread(target=keys.serve_forever, args=(0.05,), daemon=True).start()
    try:
        with socket.create_connection(keys.server_address[:2], timeout=10) as sock:
            sock.sendall(b"GET /node-keys HTTP/1.1\r\n\r\n")  # plain text to a TLS port
            with contextlib.suppress(ConnectionResetError):
                sock.recv(1024)
        deadline = time.monotonic() + 10
        while keys.refused["tls"] != 1:
            assert time.monotonic() < deadline, keys.refused
            time.sleep(0.02)
        connection = http.client.HTTPConnection(*probes.server_address[:2], timeout=10)
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
        assert 'hcs_extender_connections_refused_total{port="node-keys",reason="tls"} 1' in text
    finally:
        for server in (keys, probes):
            server.shutdown()
            server.server_close()


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize(
    "limited", [Limits(max_connections=32, max_per_client=32, read_timeout=30.0)], indirect=True
)
def test_a_parallel_header_flood_keeps_memory_bounded(limited: ExtenderServer) -> None:
    """32 connections each sending 60 header lines of 64 KB (123 MB in all, ~500 MiB of
    parsed headers in a server that reads them all): the server stops at the cap."""
    line = b"X-Flood: " + b"a" * 64_000 + b"\r\n"
    before, peak = rss(), [0]
    sending = threading.Event()

    def sample() -> None:
        while not sending.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.01)

    connected = []

    def flood() -> None:
        with plain(limited) as sock:
            connected.append(sock)
            try:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                for _ in range(60):
                    sock.sendall(line)
                sock.sendall(b"\r\n")
                sock.recv(1024)
            except OSError:
                pass  # refused midway: the server closed it

    sampler = threading.Thread(target=sample)
    sampler.start()
    floods = [threading.Thread(target=flood) for _ in range(32)]
    for thread in floods:
        thread.start()
    for thread in floods:
        thread.join(60)
    sending.set()
    sampler.join()
    assert peak[0] - before < 100 * 2**20, f"RSS grew {(peak[0] - before) / 2**20:.0f} MiB"
    deadline = time.monotonic() + 10  # counted after the answer
    assert len(connected) == 32
    while limited.refused["headers"] < 32:
        assert time.monotonic() < deadline, limited.refused
        time.sleep(0.02)


def client_hello() -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_the_handshake_has_one_short_budget(certs: Path, extender: Extender) -> None:
    """A slot is taken before the handshake: a client that sends nothing, or dribbles its
    hello, gives it back after handshake_timeout in all."""
    tls = server_context(*(str(certs / n) for n in ("extender-serving.crt",
                                                    "extender-serving.key", "ca.crt")))  # fmt: skip
    server = start(serve(extender, "127.0.0.1", 0, tls=tls, probes=False,
                         limits=Limits(handshake_timeout=1.0, read_timeout=10.0)))  # fmt: skip
    try:
        with plain(server) as silent:
            assert closed_within(silent, 1.0) < 2.5
        hello = client_hello()
        started = time.monotonic()
        with plain(server) as slow:
            try:
                for byte in hello:
                    slow.sendall(bytes([byte]))
                    time.sleep(0.05)
                    if time.monotonic() - started > 6:
                        break
            except OSError:
                pass
        assert time.monotonic() - started < 3.0
        assert server.refused["tls"] == 2
    finally:
        server.shutdown()
        server.server_close()


def test_failed_handshakes_are_logged_a_few_times_a_minute(
    secured: ExtenderServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="hcsd.cluster.httpserver"):
        for _ in range(25):
            with plain(secured) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\n\r\n")  # not TLS
                closed_within(sock, 5.0)
        deadline = time.monotonic() + 5
        while secured.refused["tls"] < 25 and time.monotonic() < deadline:
            time.sleep(0.02)
    logged = [r for r in caplog.records if "TLS handshake with 127.0.0.1 refused" in r.message]
    assert secured.refused["tls"] == 25 and 1 <= len(logged) <= 10


# --- certificates ---------------------------------------------------------------------------


def test_a_certificate_without_exactly_one_cn_is_refused(
    certs: Path, secured: ExtenderServer
) -> None:
    """Go (Kubernetes) reads the last CN, Python the first: a certificate naming both would
    be kube-scheduler here and someone else to the API server."""
    _sign(certs, "two-cns", "/CN=system:kube-scheduler/CN=hcs-admin")
    connection = client(certs, secured.server_address[1], "two-cns")
    status, data = post(connection, "/filter", FILTER)
    assert status == 403
    assert "carries 2 CNs: exactly one" in json.loads(data)["Error"]


def test_tls_without_allowed_clients_serves_nobody(certs: Path, extender: Extender) -> None:
    tls = server_context(*(str(certs / n) for n in ("extender-serving.crt",
                                                    "extender-serving.key", "ca.crt")))  # fmt: skip
    server = start(serve(extender, "127.0.0.1", 0, tls=tls, probes=False))
    try:
        status, _ = post(client(certs, server.server_address[1], "scheduler"), "/filter", FILTER)
        assert status == 403
    finally:
        server.shutdown()
        server.server_close()


def test_no_renegotiation(certs: Path) -> None:
    context = server_context(str(certs / "extender-serving.crt"),
                             str(certs / "extender-serving.key"))  # fmt: skip
    assert context.options & ssl.OP_NO_RENEGOTIATION


def served_certificate(certs: Path, port: int) -> bytes:
    connection = client(certs, port, "scheduler")
    connection.connect()
    assert isinstance(connection.sock, ssl.SSLSocket)
    der = connection.sock.getpeercert(binary_form=True)
    connection.close()
    assert der is not None
    return der


def test_renewed_certificates_are_served_without_a_restart(
    tmp_path: Path, certs: Path, extender: Extender
) -> None:
    """cert-manager renews the Secret in place, the kubelet swaps the files: new handshakes
    get the new certificate; files that do not load keep the last good one."""
    for name in ("ca.crt", "ca.key", "san.ext", "extender-serving.crt", "extender-serving.key"):
        (tmp_path / name).write_bytes((certs / name).read_bytes())
    files = CertificateFiles(*(str(tmp_path / n) for n in ("extender-serving.crt",
                             "extender-serving.key", "ca.crt")), check_every=0.0)  # fmt: skip
    server = start(serve(extender, "127.0.0.1", 0, tls=files, probes=False,
                         allowed_clients=frozenset({"system:kube-scheduler"})))  # fmt: skip
    port = server.server_address[1]
    try:
        first = served_certificate(certs, port)
        _sign(tmp_path, "extender-serving", "/CN=hcs-scheduler-extender", ext="san.ext")
        renewed = served_certificate(certs, port)
        assert renewed != first and renewed == ssl.PEM_cert_to_DER_cert(
            (tmp_path / "extender-serving.crt").read_text()
        )
        (tmp_path / "extender-serving.crt").write_text("half-written")
        assert served_certificate(certs, port) == renewed
    finally:
        server.shutdown()
        server.server_close()


def test_each_port_has_its_own_caps() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    settings = settings_from(parser.parse_args(["--insecure-plain-http",
                                                "--probe-max-connections", "5"]))  # fmt: skip
    assert settings.limits.max_connections == 64 and settings.limits.max_per_client == 32
    assert (settings.probe_limits.max_connections, settings.probe_limits.max_per_client) == (5, 4)
