"""The extender's HTTP(S) endpoint: kube-scheduler's wire format, probes and metrics.

This is the only place that knows the shapes kube-scheduler sends and expects (its
`ExtenderArgs`, `ExtenderFilterResult`, `HostPriorityList`, `ExtenderBindingArgs` and
`ExtenderBindingResult`, in JSON): it parses them into plain values for `Extender` and writes
the answers back. A body that is not what kube-scheduler sends gets 400 with the reason; a
known path asked with the wrong method gets 405.

One thread per connection (kube-scheduler keeps its connections alive), with the limits of
`httpserver.BoundedServer`: the work per call is the decision itself, done from memory. A
server has roles: the scheduling verbs (behind mutual TLS in production, and then only for
the client names allowed: kube-scheduler's), the probes and metrics (plain, for the kubelet
and Prometheus), or both on one port (tests, `--insecure-plain-http` set-ups). A body over the
limit is refused unread with 413.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from hcsd.cluster.binding import BindRequest
from hcsd.cluster.extender import Extender, FilterAnswer
from hcsd.cluster.httpserver import (
    DEFAULT_LIMITS,
    BoundedHandler,
    BoundedServer,
    Limits,
    TLSSource,
)
from hcsd.cluster.tls import PeerError, peer_of
from hcsd.contract.names import BIND_VERB, FILTER_VERB, PRIORITIZE_VERB

__all__ = [
    "MAX_BODY",
    "ExtenderServer",
    "Limits",
    "WireError",
    "bind_args",
    "extender_args",
    "serve",
]

log = logging.getLogger(__name__)

MAX_BODY = DEFAULT_LIMITS.max_body  # a pod plus 5,000+ node names fits in far less
_VERBS = (FILTER_VERB, PRIORITIZE_VERB, BIND_VERB)
_PROBES = ("/healthz", "/readyz", "/metrics")


class WireError(ValueError):
    """A request body that is not what kube-scheduler sends."""


def extender_args(body: Mapping[str, Any]) -> tuple[Mapping[str, Any], list[str]]:
    """`ExtenderArgs` (filter, prioritize): the pod and the candidate node names, from
    `NodeNames` (nodeCacheCapable) or else the names of `Nodes.items`."""
    pod = body.get("Pod") or {}
    if not isinstance(pod, dict):
        raise WireError("Pod must be an object")
    if not isinstance(pod.get("metadata") or {}, dict):
        raise WireError("Pod.metadata must be an object")
    names = body.get("NodeNames")
    if not names:
        nodes = body.get("Nodes") or {}
        items = nodes.get("items") if isinstance(nodes, dict) else None
        if not isinstance(items or [], list):
            raise WireError("Nodes.items must be a list")
        try:
            names = [item["metadata"]["name"] for item in items or []]
        except (TypeError, KeyError) as e:
            raise WireError(f"Nodes.items[] must have metadata.name: {e!r}") from None
    if not isinstance(names, list) or not set(map(type, names)) <= {str}:
        raise WireError("NodeNames must be a list of strings")
    return pod, names


def bind_args(body: Mapping[str, Any]) -> BindRequest:
    """`ExtenderBindingArgs`."""
    fields = {}
    for key in ("PodNamespace", "PodName", "PodUID", "Node"):
        value = body.get(key, "")
        if not isinstance(value, str):
            raise WireError(f"{key} must be a string")
        fields[key] = value
    return BindRequest(fields["PodNamespace"], fields["PodName"], fields["PodUID"], fields["Node"])


def _compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def filter_result(answer: FilterAnswer) -> bytes:
    """`ExtenderFilterResult` (orjson: 5,000 names and reasons in a fraction of a millisecond)."""
    result = {
        "Nodes": None,
        "NodeNames": list(answer.passed),
        "FailedNodes": dict(answer.failed),
        "FailedAndUnresolvableNodes": dict(answer.unresolvable),
        "Error": "",
    }
    return orjson.dumps(result)


# Node names as kube-scheduler sends them (DNS names), one a line: nothing to escape.
_PLAIN_NAMES = re.compile(r"[a-z0-9.-]{1,253}(?:\n[a-z0-9.-]{1,253})*")
_OPEN = '[{"Host":"'
_BETWEEN = {score: f'","Score":{score}}},{{"Host":"' for score in range(11)}  # 0..10


def host_priorities(scores: list[tuple[str, int]]) -> bytes:
    """`HostPriorityList` for thousands of nodes. The common case (DNS names, scores 0..10)
    is one join of the names with the text between them, no Python step per node; anything
    else goes through the JSON encoder."""
    if not scores:
        return b"[]"
    hosts, values = zip(*scores, strict=True)
    lines = "\n".join(hosts)  # plain only if each name is one line of the pattern
    plain = lines.count("\n") == len(hosts) - 1 and _PLAIN_NAMES.fullmatch(lines)
    if not (plain and set(values) <= _BETWEEN.keys()):
        return orjson.dumps([{"Host": h, "Score": int(s)} for h, s in scores])
    parts: list[str] = [""] * (2 * len(hosts))
    parts[0::2] = hosts
    parts[1::2] = map(_BETWEEN.__getitem__, values)
    joined = "".join(parts)
    return (_OPEN + joined[: -len(',{"Host":"')] + "]").encode()


class ExtenderServer(BoundedServer):
    extender: Extender
    ready: bool = False
    scheduling: bool = True  # serves the verbs
    probes: bool = True  # serves /healthz, /readyz, /metrics
    allowed_clients: frozenset[str] = frozenset()  # client certificate CNs (over TLS)
    siblings: tuple[BoundedServer, ...] = ()  # the process's other ports, for /metrics
    registry: CollectorRegistry  # what /metrics exports: the extender's, and refusals


class _Refusals(Collector):
    """Connections this port and its siblings closed unserved, by reason."""

    def __init__(self, server: ExtenderServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "hcs_extender_connections_refused",
            "Connections closed unserved: over the cap in all or per client, a failed TLS "
            "handshake, headers or a body over the limit.",
            labels=["port", "reason"],
        )
        for server in (self.server, *self.server.siblings):
            for reason in ("connections", "client", "tls", "headers", "body"):
                family.add_metric([server.name, reason], server.refused[reason])
        yield family


class _Handler(BoundedHandler):
    # Headers and body go out as separate writes: without TCP_NODELAY, Nagle's algorithm and
    # the client's delayed ACK add ~40 ms to every answer.
    disable_nagle_algorithm = True
    server: ExtenderServer

    def handle(self) -> None:
        try:
            super().handle()
        except (ssl.SSLError, ConnectionError) as e:  # the client broke the connection off
            log.debug("%s: connection ended: %s", self.address_string(), e)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _reply(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.connection.settimeout(self.server.limits.read_timeout)  # the client must read it
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, **headers: str) -> None:
        self._reply(status, _compact({"Error": message}), headers=headers)

    def _verb(self) -> str | None:
        if not self.server.scheduling:
            return None
        verb = self.path.strip("/").rsplit("/", 1)[-1]
        return verb if verb in _VERBS else None

    def _probe(self) -> bool:
        return self.server.probes and self.path in _PROBES

    def do_GET(self) -> None:
        extender = self.server.extender
        if not self._probe():
            if self._verb() is not None:
                self._wrong_method()
            else:
                self._reply(404, b"not found\n", "text/plain")
        elif self.path == "/healthz":
            self._reply(200, b"ok\n", "text/plain")
        elif self.path == "/readyz":
            ready = self.server.ready and extender.is_leader()
            self._reply(200 if ready else 503, b"ok\n" if ready else b"not leading\n", "text/plain")
        elif self.path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept") or "")
            self._reply(200, encoder(self.server.registry), content_type)

    def _unread_body(self) -> None:
        """A reply before the body is read: the connection cannot carry another request."""
        if self.headers.get("Content-Length", "0") != "0":
            self.close_connection = True

    def _wrong_method(self) -> None:
        self._unread_body()
        if self._verb() is not None:
            self._error(405, f"{self.command} not allowed: POST only", Allow="POST")
        elif self._probe():
            self._error(405, f"{self.command} not allowed: GET only", Allow="GET")
        else:
            self._error(404, "not found")

    do_PUT = do_DELETE = do_PATCH = _wrong_method

    def _body(self, loads: Callable[[bytes], Any] = json.loads) -> dict[str, Any] | None:
        """The request's JSON object, or None after replying 400."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        limit = self.server.limits.max_body
        if not 0 < length <= limit:
            # The body is not read: the connection cannot carry another request after it.
            self.close_connection = True
            if length > limit:
                self.server.count_refusal("body")
                self._error(413, f"a body of {length} bytes is over the limit of {limit}")
            else:
                self._error(400, f"body length must be 1..{limit} (Content-Length)")
            return None
        try:
            data = self.rfile.read(length)
        except OSError as e:  # the read deadline, or the client went away
            self.close_connection = True
            log.info("%s: body not read: %s", self.address_string(), e)
            return None
        try:
            body = loads(data)
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
        except (ValueError, RecursionError) as e:  # RecursionError: nested past Python's depth
            self._error(400, f"bad request body: {e}")
            return None
        return body

    def _refused_client(self) -> str | None:
        """Why this connection's client may not call the verbs, or None. Over TLS only the
        allowed names may (none allowed: nobody); in plain HTTP nobody can be told apart, so
        anyone may (`--insecure-plain-http`, tests)."""
        if self.server.tls is None:
            return None
        try:
            peer = peer_of(self.connection)
        except PeerError as e:
            return str(e)
        if peer is None:
            return "a client certificate is required"
        if peer.common_name not in self.server.allowed_clients:
            return f"client {peer.common_name!r} is not allowed to call the extender"
        return None

    def do_POST(self) -> None:
        verb = self._verb()
        if verb is None:
            if self._probe():
                self._wrong_method()
            else:
                self._unread_body()
                self._error(404, "unknown verb")
            return
        refused = self._refused_client()
        if refused is not None:
            self.close_connection = True
            log.warning("%s: %s %s refused: %s", self.address_string(), verb, self.path, refused)
            self._error(403, refused)
            return
        # Filter and prioritize bodies carry every node's name: orjson reads them 2-3x faster.
        body = self._body(json.loads if verb == BIND_VERB else orjson.loads)
        if body is None:
            return
        extender = self.server.extender
        try:
            if verb == BIND_VERB:
                error = extender.bind(bind_args(body))
                self._reply(200, _compact({"Error": error}))
                return
            pod, names = extender_args(body)
            if verb == FILTER_VERB:
                self._reply(200, filter_result(extender.filter(pod, names)))
            else:
                self._reply(200, host_priorities(extender.prioritize(pod, names)))
        except WireError as e:
            self._error(400, f"bad request body: {e}")
        except Exception as e:  # a bug must not cost kube-scheduler its connection
            log.exception("%s failed", verb)
            extender.metrics.errors.labels(verb).inc()
            self._error(500, f"{verb} failed: {e!r}")


def serve(
    extender: Extender,
    host: str,
    port: int,
    *,
    tls: TLSSource | None = None,
    allowed_clients: frozenset[str] = frozenset(),
    scheduling: bool = True,
    probes: bool = True,
    limits: Limits = DEFAULT_LIMITS,
    name: str = "",
) -> ExtenderServer:
    """Bind (port 0 picks one: see `server.server_address`); the caller runs serve_forever.

    `tls` (see `tls.server_context`, `tls.CertificateFiles`) with a client CA and
    `allowed_clients` is how the verbs are served in production: no certificate, no
    connection; a certificate of a name not allowed, 403 (with none allowed: every one)."""
    server = ExtenderServer((host, port), _Handler, tls=tls, limits=limits, name=name or str(port))
    server.extender = extender
    server.scheduling = scheduling
    server.probes = probes
    server.allowed_clients = allowed_clients
    server.registry = CollectorRegistry()
    server.registry.register(extender.metrics.registry)
    server.registry.register(_Refusals(server))
    return server
