"""The extender's node-keys port: `GET /node-keys` over HTTPS, for hcs-syncers only.

Its own port and server, apart from kube-scheduler's: callers are every node's syncer, not
the scheduler, and they authenticate by service-account token (node_keys.NodeKeys), not by
client certificate. The transport is the extender's bounded server and handler
(httpserver.py: capped connections in all and per client, the handshake in the connection's
thread, a deadline per request, the first one included, capped headers). Requests carry no
body. Plain HTTP only with an explicit flag, for tests and development: a token and
the keys then cross the network readable.
"""

from __future__ import annotations

import logging
from typing import Any

from hcsd.cluster.httpserver import DEFAULT_LIMITS, BoundedHandler, BoundedServer, Limits
from hcsd.cluster.node_keys import NodeKeys, Refused
from hcsd.cluster.tls import CertificateFiles

__all__ = ["PATH", "serve_node_keys"]

log = logging.getLogger(__name__)

PATH = "/node-keys"


class _Server(BoundedServer):
    node_keys: NodeKeys


class _Handler(BoundedHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _reply(self, status: int, body: str, content_type: str = "text/plain") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path != PATH:
            self._reply(404, "not found\n")
            return
        try:
            keys = self.server.node_keys.answer(self.headers.get("Authorization", ""))
        except Refused as e:
            log.warning("node keys refused to %s: %s", self.address_string(), e)
            self._reply(e.status, f"{e}\n")
            return
        except Exception:  # a bug answers 500 rather than dropping the connection
            log.exception("node keys failed for %s", self.address_string())
            self._reply(500, "node keys failed: see the extender's log\n")  # no detail out
            return
        self._reply(200, keys, "application/json")

    def _not_allowed(self) -> None:
        self.close_connection = True  # a body, if any, is not read
        self._reply(405, "GET only\n")

    do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed


def serve_node_keys(
    node_keys: NodeKeys,
    host: str,
    port: int,
    *,
    cert: str,
    key: str,
    plain_http: bool = False,
    limits: Limits = DEFAULT_LIMITS,
    reload_seconds: float = 10.0,
) -> _Server:
    """Bind (port 0 picks one); the caller runs serve_forever in a thread of its own. The
    context is the scheduling port's (tls.CertificateFiles: no renegotiation, TLS 1.2 at
    least, the files loaded again when cert-manager or kubelet replaces them)."""
    if not cert and not plain_http:
        raise ValueError("the node-keys port needs a TLS certificate (or the explicit dev flag)")
    tls = None
    if cert:
        tls = CertificateFiles(cert, key, check_every=reload_seconds)  # TLSSetupError: unusable
    else:
        log.warning(
            "SERVING NODE KEYS OVER PLAIN HTTP (--node-keys-insecure-http): tokens and keys "
            "cross the network readable; for tests and development only"
        )
    server = _Server((host, port), _Handler, tls=tls, limits=limits, name="node-keys")
    server.node_keys = node_keys
    return server
