"""The extender's two ports, from its command line: scheduling (mutual TLS) and probes.

- `--listen` (8888) serves filter, prioritize and bind, over TLS, to clients whose certificate
  the `--tls-client-ca` signed and whose CN is an `--allowed-client` (kube-scheduler's,
  `system:kube-scheduler`, by default). Without a certificate the handshake fails: nothing of
  the request is read. Plain HTTP only with `--insecure-plain-http`, logged as a warning at
  start.
- `--probe-listen` (8889) serves /healthz, /readyz and /metrics in plain HTTP: the kubelet's
  probes and Prometheus cannot present kube-scheduler's certificate, and what they read tells
  nobody anything that decides a placement. The NetworkPolicy leaves it open and keeps the
  scheduling port to the control plane.
"""

from __future__ import annotations

import argparse
import logging
import ssl
import sys
import threading
from dataclasses import dataclass

from hcsd.cluster.extender import Extender
from hcsd.cluster.http import ExtenderServer, serve
from hcsd.cluster.httpserver import DEFAULT_LIMITS, Limits
from hcsd.cluster.tls import TLSSetupError, server_context
from hcsd.contract.names import EXTENDER_PORT

__all__ = [
    "PROBE_PORT",
    "Endpoints",
    "Settings",
    "add_flags",
    "open_endpoints",
    "settings_from",
]

log = logging.getLogger(__name__)

PROBE_PORT = EXTENDER_PORT + 1
KUBE_SCHEDULER = "system:kube-scheduler"  # the CN of kube-scheduler's client certificate


def add_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("serving")
    group.add_argument("--listen", default=f"0.0.0.0:{EXTENDER_PORT}", help="scheduling HOST:PORT")
    group.add_argument(
        "--probe-listen",
        default=f"0.0.0.0:{PROBE_PORT}",
        help="/healthz, /readyz, /metrics in plain HTTP on HOST:PORT ('' : on --listen)",
    )
    group.add_argument("--tls-cert", default="", help="serving certificate (PEM)")
    group.add_argument("--tls-key", default="", help="its private key (PEM)")
    group.add_argument("--tls-client-ca", default="", help="CA of kube-scheduler's client cert")
    group.add_argument(
        "--allowed-client",
        action="append",
        default=[],
        metavar="CN",
        help=f"a client certificate CN that may schedule (repeat; default {KUBE_SCHEDULER})",
    )
    group.add_argument(
        "--insecure-plain-http",
        action="store_true",
        help="serve the scheduling verbs in plain HTTP to anyone who can connect (tests only)",
    )
    group.add_argument("--max-body-bytes", type=int, default=DEFAULT_LIMITS.max_body)
    group.add_argument("--max-connections", type=int, default=DEFAULT_LIMITS.max_connections)
    group.add_argument("--read-timeout", type=float, default=DEFAULT_LIMITS.read_timeout)


def _address(parser: argparse.ArgumentParser, flag: str, text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not port.isdigit():
        parser.error(f"{flag} must be HOST:PORT, got {text!r}")
    return host or "0.0.0.0", int(port)  # noqa: S104 - an empty host means all, as Services need


class Endpoints:
    """The servers, started and stopped together; `ready` is what /readyz reports."""

    def __init__(self, servers: list[ExtenderServer]) -> None:
        self.servers = servers
        for server in servers:
            server.siblings = tuple(s for s in servers if s is not server)

    @property
    def scheduling(self) -> ExtenderServer:
        return self.servers[0]

    def set_ready(self) -> None:
        for server in self.servers:
            server.ready = True

    def serve_forever(self) -> None:
        """The others in threads, the first in the caller's: returns after `shutdown`."""
        for server in self.servers[1:]:
            threading.Thread(target=server.serve_forever, name=server.name, daemon=True).start()
        self.scheduling.serve_forever()

    def shutdown(self) -> None:
        for server in self.servers:
            server.shutdown()


@dataclass(frozen=True)
class Settings:
    """The ports and how they are served, checked (before anything else starts)."""

    scheduling: tuple[str, int]
    probes: tuple[str, int] | None  # None: on the scheduling port
    tls: ssl.SSLContext | None
    allowed: frozenset[str]
    limits: Limits


def settings_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Settings:
    """The flags checked: a usage error for an unsafe or incomplete set, exit 2 for TLS files
    that cannot be loaded."""
    limits = Limits(
        max_body=args.max_body_bytes,
        max_connections=args.max_connections,
        read_timeout=args.read_timeout,
    )
    allowed = frozenset(args.allowed_client or [KUBE_SCHEDULER])
    tls_files = (args.tls_cert, args.tls_key, args.tls_client_ca)
    tls = None
    if args.insecure_plain_http:
        if any(tls_files):
            parser.error("--insecure-plain-http and --tls-* exclude each other")
        allowed = frozenset()
    elif not all(tls_files):
        parser.error(
            "--tls-cert, --tls-key and --tls-client-ca are required: only kube-scheduler, with "
            "its client certificate, may call the extender (--insecure-plain-http for tests)"
        )
    else:
        try:
            tls = server_context(*tls_files)
        except TLSSetupError as e:
            print(f"hcs-scheduler-extender: {e}", file=sys.stderr)
            raise SystemExit(2) from e
    probes = _address(parser, "--probe-listen", args.probe_listen) if args.probe_listen else None
    return Settings(_address(parser, "--listen", args.listen), probes, tls, allowed, limits)


def open_endpoints(extender: Extender, settings: Settings) -> Endpoints:
    """Bind the ports."""
    tls, limits = settings.tls, settings.limits
    servers = [
        serve(extender, *settings.scheduling, tls=tls, allowed_clients=settings.allowed,
              probes=settings.probes is None, limits=limits, name="scheduling")
    ]  # fmt: skip
    if settings.probes is not None:
        servers.append(
            serve(extender, *settings.probes, scheduling=False, limits=limits, name="probes")
        )
    if tls is None:
        log.warning(
            "INSECURE: --insecure-plain-http: filter, prioritize and bind are served in plain "
            "HTTP to ANY client that can connect to %s:%d; anyone there can have pods bound "
            "with signed assignments. Use --tls-cert, --tls-key and --tls-client-ca.",
            *servers[0].server_address[:2],
        )
    else:
        log.info("scheduling over mutual TLS for client(s) %s", ", ".join(sorted(settings.allowed)))
    return Endpoints(servers)
