"""The extender's HTTP(S) endpoint: kube-scheduler's verbs, probes and metrics.

One thread per connection (kube-scheduler keeps its connections alive) in the standard
library's server: the work per call is the decision itself, done from memory. Bodies are
bounded and must be JSON objects; anything else gets 400 with the reason.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from hcsd.cluster.extender import Extender
from hcsd.contract.names import BIND_VERB, FILTER_VERB, PRIORITIZE_VERB

__all__ = ["serve"]

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024 * 1024  # a pod plus 5,000+ node names fits in far less


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    extender: Extender
    ready: bool = False


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out as separate writes: without TCP_NODELAY, Nagle's algorithm and
    # the client's delayed ACK add ~40 ms to every answer.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        extender = self.server.extender
        if self.path == "/healthz":
            self._reply(200, b"ok\n", "text/plain")
        elif self.path == "/readyz":
            ready = self.server.ready and extender.is_leader()
            self._reply(200 if ready else 503, b"ok\n" if ready else b"not leading\n", "text/plain")
        elif self.path == "/metrics":
            text = extender.metrics.render(extender.gauges())
            self._reply(200, text.encode(), "text/plain; version=0.0.4")
        else:
            self._reply(404, b"not found\n", "text/plain")

    def do_POST(self) -> None:
        verb = self.path.strip("/").rsplit("/", 1)[-1]
        handlers = {
            FILTER_VERB: self.server.extender.filter,
            PRIORITIZE_VERB: self.server.extender.prioritize,
            BIND_VERB: self.server.extender.bind,
        }
        handler = handlers.get(verb)
        if handler is None:
            self._reply(404, b'{"Error":"unknown verb"}')
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 < length <= MAX_BODY:
            self._reply(400, json.dumps({"Error": f"body length must be 1..{MAX_BODY}"}).encode())
            return
        try:
            args = json.loads(self.rfile.read(length))
            if not isinstance(args, dict):
                raise ValueError("the body must be a JSON object")
        except ValueError as e:
            self._reply(400, json.dumps({"Error": f"bad request body: {e}"}).encode())
            return
        if verb == PRIORITIZE_VERB:
            self._reply(200, _host_priorities(self.server.extender.prioritize(args)))
        else:
            self._reply(200, json.dumps(handler(args), separators=(",", ":")).encode())


_PLAIN_NAME = re.compile(r"[a-z0-9.-]{1,253}")


def _host_priorities(scores: list[dict[str, Any]]) -> bytes:
    """`[{"Host": ..., "Score": ...}]` for thousands of nodes: node names are DNS names, so
    they are written as they are (anything else goes through the JSON encoder)."""
    parts = []
    for entry in scores:
        host = entry["Host"]
        quoted = f'"{host}"' if _PLAIN_NAME.fullmatch(host) else json.dumps(host)
        parts.append(f'{{"Host":{quoted},"Score":{int(entry["Score"])}}}')
    return ("[" + ",".join(parts) + "]").encode()


def serve(extender: Extender, host: str, port: int, *, cert: str = "", key: str = "") -> _Server:
    """Bind (port 0 picks one: see `server.server_address`); the caller runs serve_forever."""
    server = _Server((host, port), _Handler)
    server.extender = extender
    if cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key or None)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    return server
