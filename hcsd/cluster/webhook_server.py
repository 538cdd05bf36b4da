"""`hcs-admission-webhook`: the mutating webhook (webhook.py) served over HTTPS.

`POST /mutate` answers an AdmissionReview; `GET /healthz` answers `ok` (the kubelet's probes,
over the same TLS port: they check no certificate). The transport is the extender's bounded
server (httpserver.py: connections capped in all and per client, the handshake in the
connection's thread, a deadline per request, capped headers) and its certificate files are
reloaded when they change (tls.CertificateFiles), so a renewed Secret needs no restart. The
API server presents no client certificate to webhooks by default, and what it would gain by
calling is a scheduler name it could set itself: the port needs no caller check. In DRA mode
(`--mode dra`) a caller can also have claim templates created, one per shape and namespace:
docs/dra.md asks for the chart's NetworkPolicy there.

Every pod in the cluster can reach the port unless a NetworkPolicy says otherwise, and with
failurePolicy Fail a webhook knocked out refuses every pod asking for ai.compute/*. So what
one caller can take is bounded (`WEBHOOK_LIMITS`, `ReviewSlots`):

- a body is at most 3 MiB: the API server takes request bodies up to 3 MiB and etcd stores
  objects up to 1.5 MiB, so a pod that can exist is under it as JSON; a bigger review is that
  pod's alone and is refused (413) without being read;
- a body is read and parsed only in one of `REVIEW_SLOTS` slots, at most one per source
  address, waited for up to `SLOT_WAIT` seconds, else 503 (the API server then applies the
  failurePolicy to that one pod). Parsing is what costs memory: 3 MiB of `[{},{},...]` is
  about 80 MiB of Python objects, so the process's peak is bounded by the slots, and the
  chart's memory limit is sized on it (tests/unit/test_webhook.py measures it). The answer
  is made in the slot as far as the pod alone allows (webhook.prepare: in DRA mode with the
  read of a RuntimeProfile the pod names, one GET); in DRA mode the
  calls to the API server (the ComputeQuota's reads, the template) come after the slot is
  given back and hold only the plan, not the pod: the API server is one source address for
  every tenant, and a namespace whose reads are slow would otherwise hold the slot every
  other namespace's pods need (claim_quota bounds that work per namespace instead);
- connections: 128 in all, 48 per source address, 10 s idle between requests and 5 s to send
  one: three addresses are needed to fill the port, one cannot starve another. (48, not
  fewer: the API server is one address carrying every tenant's reviews, and in DRA mode a
  namespace may have nine of them at the API server at once, claim_quota.)
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from hcsd import __version__
from hcsd.cluster.httpserver import DEFAULT_LIMITS, BoundedHandler, BoundedServer, Limits
from hcsd.cluster.tls import CertificateFiles, TLSSetupError
from hcsd.cluster.webhook import Pending, ReviewError, Rule, finish, parse_review, prepare, reviewed
from hcsd.contract.dra import MODE_DRA, MODE_EXTENDER
from hcsd.profiles.database import ProfileDatabase, ProfileError

__all__ = [
    "MUTATE_PATH",
    "REVIEW_SLOTS",
    "WEBHOOK_LIMITS",
    "WEBHOOK_PORT",
    "ReviewSlots",
    "main",
    "serve_webhook",
]

log = logging.getLogger("hcs.webhook")

MUTATE_PATH = "/mutate"
WEBHOOK_PORT = 8443
WEBHOOK_LIMITS = replace(
    DEFAULT_LIMITS,
    max_body=3 * 1024 * 1024,
    max_connections=128,
    # The API server is one address for every tenant: a namespace's admissions in progress
    # and waiting (claim_quota: 1 + 8) from two busy namespaces at once fit with room left.
    max_per_client=48,
    read_timeout=5.0,
    idle_timeout=10.0,
)
REVIEW_SLOTS = 2  # reviews read and parsed at once (a pod's takes well under a millisecond)
SLOT_WAIT = 2.0  # seconds a review waits for a slot before 503


class ReviewSlots:
    """At most `total` reviews at once and `per_client` from one source address: a caller
    sending slow or huge bodies holds its own slot, never every one."""

    def __init__(self, total: int = REVIEW_SLOTS, per_client: int = 1, wait: float = SLOT_WAIT):
        self.total = total
        self.per_client = per_client
        self.wait = wait
        self._busy: Counter[str] = Counter()
        self._free = threading.Condition()

    def take(self, host: str) -> bool:
        """Wait up to `wait` seconds for a slot; False if none came."""
        deadline = time.monotonic() + self.wait
        with self._free:
            while self._busy.total() >= self.total or self._busy[host] >= self.per_client:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._free.wait(left)
            self._busy[host] += 1
            return True

    def give(self, host: str) -> None:
        with self._free:
            self._busy[host] -= 1
            if self._busy[host] <= 0:
                del self._busy[host]
            self._free.notify_all()


class _Server(BoundedServer):
    rule: Rule
    slots: ReviewSlots


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
        host = self.client_address[0]
        if not self.server.slots.take(host):
            self.server.count_refusal("busy")
            self._refuse(503, "busy: reviews from this address or in all at their limit")
            return
        try:
            prepared = self._prepare(int(length))
        finally:
            self.server.slots.give(host)
        if prepared is not None:
            self._answer(prepared)

    def _prepare(self, length: int) -> dict[str, Any] | Pending | None:
        """Under a review slot: the body read, parsed and answered as far as the pod alone
        allows (slots bound the memory of bodies being parsed); None once answered or
        dropped. What is left (DRA mode: the quota and the template) waits on the API server
        after the slot is given back and holds only the plan: the API server is the one
        caller for every tenant, and claim_quota bounds that work per namespace."""
        try:
            body = self.rfile.read(length)
        except OSError as e:  # the read deadline, or the caller went away
            self.close_connection = True
            log.info("%s: body not read: %s", self.address_string(), e)
            return None
        try:
            return prepare(parse_review(body), self.server.rule)
        except ReviewError as e:
            log.warning("refused a request from %s: %s", self.address_string(), e)
            self._reply(400, f"not an AdmissionReview: {e}\n".encode())
        except Exception:  # a bug answers 500 rather than dropping the connection
            log.exception("failed to review a request from %s", self.address_string())
            self._reply(500, b"the webhook failed: see its log\n")
        return None

    def _answer(self, prepared: dict[str, Any] | Pending) -> None:
        try:
            response = finish(prepared, self.server.rule)
        except Exception:  # a bug answers 500 rather than dropping the connection
            log.exception("failed to review a request from %s", self.address_string())
            self._reply(500, b"the webhook failed: see its log\n")
            return
        template = (response.get("auditAnnotations") or {}).get("claim-template")
        if template:
            log.info("review %s: claim from ResourceClaimTemplate %s", response["uid"], template)
        elif "patch" in response:
            log.info("review %s: spec.schedulerName set to %s", response["uid"],
                     self.server.rule.scheduler)  # fmt: skip
        elif not response["allowed"]:
            log.info("review %s: refused: %r", response["uid"], response["status"]["message"])
        self._reply(200, json.dumps(reviewed(response)).encode(), "application/json")

    def _not_allowed(self) -> None:
        self._refuse(405, "POST /mutate or GET /healthz")

    do_PUT = do_DELETE = do_PATCH = _not_allowed


def serve_webhook(
    host: str,
    port: int,
    tls: CertificateFiles | None,
    rule: Rule,
    limits: Limits = WEBHOOK_LIMITS,
    *,
    slots: ReviewSlots | None = None,
) -> _Server:
    """Bind (port 0 picks one); the caller runs serve_forever. `tls` None is plain HTTP (tests
    of the handler only: the API server calls webhooks over HTTPS alone)."""
    server = _Server((host, port), _Handler, tls=tls, limits=limits, name="webhook")
    server.rule = rule
    server.slots = slots or ReviewSlots()
    return server


def _rule(args: argparse.Namespace) -> Rule:
    """The Rule for the command line; in DRA mode, with an API client (the webhook's service
    account, or --kubeconfig) that gives up quickly: the API server waits for the webhook
    for timeoutSeconds (5 s in the chart) in all."""
    if args.mode != MODE_DRA:
        return Rule(args.scheduler_name)
    # The Kubernetes client only here: extender mode's process stays without it (~25 MiB).
    from kubernetes.config import ConfigException

    from hcsd.cluster.claim_quota import QuotaGate
    from hcsd.cluster.claim_templates import Templates
    from hcsd.cluster.kube import Kube
    from hcsd.cluster.kubeconfig import KubeconfigError
    from hcsd.cluster.profile_gate import ProfileReader

    db = ProfileDatabase.load(Path(args.profiles) if args.profiles else None)
    try:
        kube = Kube.connect(args.kubeconfig or None, timeout=1.5)  # most answers take ms
    except (ConfigException, KubeconfigError) as e:
        raise ValueError(str(e)) from e
    return Rule(
        args.scheduler_name, mode=MODE_DRA, ensure=Templates(kube).ensure, profiles=db,
        quota=QuotaGate(kube, db), runtime_profiles=ProfileReader(kube),
    )  # fmt: skip


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
    parser.add_argument(
        "--mode",
        choices=(MODE_EXTENDER, MODE_DRA),
        default=MODE_EXTENDER,
        help="extender: set spec.schedulerName; dra: ResourceClaimTemplates (docs/dra.md)",
    )
    parser.add_argument(
        "--kubeconfig", default="", help="DRA mode: kubeconfig (default: the service account)"
    )
    parser.add_argument("--profiles", default="", help="profile database (default: built in)")
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
    try:
        rule = _rule(args)
    except (ProfileError, OSError, ValueError) as e:
        print(f"hcs-admission-webhook: failed to set up {args.mode} mode: {e}", file=sys.stderr)
        return 2
    server = serve_webhook(host or "0.0.0.0", int(port), tls, rule, limits)  # noqa: S104

    def stop(*_: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    what = (
        "a ResourceClaimTemplate" if rule.mode == MODE_DRA
        else f"spec.schedulerName {args.scheduler_name}"
    )  # fmt: skip
    log.info("hcs-admission-webhook %s on %s:%d: pods asking for ai.compute/* get %s",
             __version__, *server.server_address[:2], what)  # fmt: skip
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
