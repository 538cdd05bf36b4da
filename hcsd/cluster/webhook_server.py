"""`hcs-admission-webhook`: the mutating webhook (webhook.py) served over HTTPS.

`POST /mutate` answers an AdmissionReview; `GET /healthz` answers `ok` (the kubelet's probes,
over the same TLS port: they check no certificate). The transport is the extender's bounded
server (httpserver.py: connections capped in all and per client, the handshake in the
connection's thread, a deadline per request, capped headers) and its certificate files are
reloaded when they change (tls.CertificateFiles), so a renewed Secret needs no restart. The
API server presents no client certificate to webhooks by default, and what it would gain by
calling is a scheduler name it could set itself: the port needs no caller check.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hcsd import __version__
from hcsd.cluster.httpserver import DEFAULT_LIMITS, BoundedHandler, BoundedServer, Limits
from hcsd.cluster.tls import CertificateFiles, TLSSetupError
from hcsd.cluster.webhook import ReviewError, Rule, review

__all__ = ["MUTATE_PATH", "WEBHOOK_LIMITS", "WEBHOOK_PORT", "main", "serve_webhook"]

log = logging.getLogger("hcs.webhook")

MUTATE_PATH = "/mutate"
WEBHOOK_PORT = 8443
# The API server calls from few addresses with many requests in parallel.
WEBHOOK_LIMITS = replace(DEFAULT_LIMITS, max_per_client=32)


class _Server(BoundedServer):
    rule: Rule


class _Handler(BoundedHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _reply(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _refuse(self, status: int, reason: str) -> None:
        self.close_connection = True  # the body, if any, is not read
        self._reply(status, f"{reason}\n".encode())

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._reply(200, b"ok\n")
        else:
            self._reply(404, b"not found\n")

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != MUTATE_PATH:
            self._refuse(404, "not found")
            return
        length = self.headers.get("Content-Length", "")
        if not length:
            self._refuse(411, "Content-Length is required")
            return
        if not (length.isascii() and length.isdigit()):  # '²'.isdigit() is True; int() fails
            self._refuse(400, "Content-Length must be a decimal number")
            return
        if int(length) > self.server.limits.max_body:
            self.server.count_refusal("body")
            self._refuse(413, f"an AdmissionReview over {self.server.limits.max_body} bytes")
            return
        body = self.rfile.read(int(length))
        try:
            answer = review(body, self.server.rule)
        except ReviewError as e:
            log.warning("refused a request from %s: %s", self.address_string(), e)
            self._reply(400, f"not an AdmissionReview: {e}\n".encode())
            return
        except Exception:  # a bug answers 500 rather than dropping the connection
            log.exception("failed to review a request from %s", self.address_string())
            self._reply(500, b"the webhook failed: see its log\n")
            return
        response = answer["response"]
        if "patch" in response:
            log.info("review %s: spec.schedulerName set to %s", response["uid"],
                     self.server.rule.scheduler)  # fmt: skip
        self._reply(200, json.dumps(answer).encode(), "application/json")

    def _not_allowed(self) -> None:
        self._refuse(405, "POST /mutate or GET /healthz")

    do_PUT = do_DELETE = do_PATCH = _not_allowed


def serve_webhook(
    host: str, port: int, tls: CertificateFiles | None, rule: Rule, limits: Limits = WEBHOOK_LIMITS
) -> _Server:
    """Bind (port 0 picks one); the caller runs serve_forever. `tls` None is plain HTTP (tests
    of the handler only: the API server calls webhooks over HTTPS alone)."""
    server = _Server((host, port), _Handler, tls=tls, limits=limits, name="webhook")
    server.rule = rule
    return server


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hcs-admission-webhook",
        description="Send pods asking for ai.compute/* to HCS's scheduler (a mutating webhook).",
    )
    parser.add_argument(
        "--version", action="version", version=f"hcs-admission-webhook {__version__}"
    )
    parser.add_argument("--listen", default=f"0.0.0.0:{WEBHOOK_PORT}", help="HOST:PORT (HTTPS)")
    parser.add_argument("--tls-cert", required=True, help="serving certificate (PEM)")
    parser.add_argument("--tls-key", required=True, help="its private key (PEM)")
    parser.add_argument("--tls-reload-seconds", type=float, default=10.0)
    parser.add_argument(
        "--scheduler-name", default=Rule().scheduler, help="the spec.schedulerName to set"
    )
    parser.add_argument("--max-body-bytes", type=int, default=WEBHOOK_LIMITS.max_body)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    host, _, port = args.listen.rpartition(":")
    if not (port.isascii() and port.isdigit()):
        parser.error(f"--listen must be HOST:PORT, got {args.listen!r}")
    try:
        tls = CertificateFiles(args.tls_cert, args.tls_key, check_every=args.tls_reload_seconds)
    except TLSSetupError as e:
        print(f"hcs-admission-webhook: {e}", file=sys.stderr)
        return 2
    limits = replace(WEBHOOK_LIMITS, max_body=args.max_body_bytes)
    server = serve_webhook(host or "0.0.0.0", int(port), tls, Rule(args.scheduler_name), limits)  # noqa: S104

    def stop(*_: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    log.info("hcs-admission-webhook %s on %s:%d: pods asking for ai.compute/* get "
             "spec.schedulerName %s", __version__, *server.server_address[:2],
             args.scheduler_name)  # fmt: skip
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
