"""The extender's two ports, from its command line: scheduling (mutual TLS) and probes.

- `--listen` (8888) serves filter, prioritize and bind, over TLS, to clients whose certificate
  the `--tls-client-ca` signed and whose CN is an `--allowed-client` (kube-scheduler's,
  `system:kube-scheduler`, by default). Without a certificate the handshake fails: nothing of
  the request is read. Plain HTTP only with `--insecure-plain-http`, logged as a warning at
  start.
- `--probe-listen` (8889) serves /healthz, /readyz and /metrics in plain HTTP: the kubelet's
  probes and Prometheus cannot present kube-scheduler's certificate, and what they read tells
  nobody anything that decides a placement. The NetworkPolicy lets the nodes (the kubelet)
  and the monitoring namespace reach it, and keeps the scheduling port to the control plane.

Each port has its own connection caps, in all and per source address, so a flood of one
does not silence the other: the probe port's are smaller (its clients are few and quick);
the scheduling port lets one address (kube-scheduler's, whose binds run in parallel) hold
more.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from dataclasses import dataclass, replace

from hcsd.cluster.extender import Extender
from hcsd.cluster.http import ExtenderServer, serve
from hcsd.cluster.httpserver import DEFAULT_LIMITS, BoundedServer, Limits
from hcsd.cluster.tls import CertificateFiles
from hcsd.contract.names import EXTENDER_PORT

__all__ = [
    "PROBE_LIMITS",
    "PROBE_PORT",
    "SCHEDULING_LIMITS",
    "Endpoints",
    "Settings",
    "UsageError",
    "add_flags",
    "open_endpoints",
    "settings_from",
]

log = logging.getLogger(__name__)

PROBE_PORT = EXTENDER_PORT + 1
KUBE_SCHEDULER = "system:kube-scheduler"  # the CN of kube-scheduler's client certificate
SCHEDULING_LIMITS = replace(DEFAULT_LIMITS, max_per_client=32)  # kube-scheduler binds in parallel
PROBE_LIMITS = replace(DEFAULT_LIMITS, max_connections=16, max_per_client=4)


class UsageError(ValueError):
    """Flags that do not make a safe, complete set (the command says it as a usage error)."""


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
    group.add_argument(
        "--tls-reload-seconds",
        type=float,
        default=10.0,
        help="look for renewed --tls-* files at most this often (they are reloaded in place)",
    )
    limits = parser.add_argument_group("limits")
    limits.add_argument("--max-body-bytes", type=int, default=SCHEDULING_LIMITS.max_body)
    limits.add_argument("--read-timeout", type=float, default=SCHEDULING_LIMITS.read_timeout)
    limits.add_argument(
        "--handshake-timeout", type=float, default=SCHEDULING_LIMITS.handshake_timeout
    )
    limits.add_argument("--max-header-bytes", type=int, default=SCHEDULING_LIMITS.max_header_bytes)
    for prefix, port, default in (
        ("", "scheduling", SCHEDULING_LIMITS),
        ("probe-", "probe", PROBE_LIMITS),
    ):
        limits.add_argument(
            f"--{prefix}max-connections",
            type=int,
            default=default.max_connections,
            help=f"connections served at once on the {port} port",
        )
        limits.add_argument(
            f"--{prefix}max-connections-per-client",
            type=int,
            default=default.max_per_client,
            help="... of them from one source address",
        )


def _address(flag: str, text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not (port.isascii() and port.isdigit()):
        raise UsageError(f"{flag} must be HOST:PORT, got {text!r}")
    return host or "0.0.0.0", int(port)  # noqa: S104 - an empty host means all, as Services need


class Endpoints:
    """The servers, started and stopped together; `ready` is what /readyz reports."""

    def __init__(self, servers: list[ExtenderServer]) -> None:
        self.servers = servers
        for server in servers:
            server.siblings = tuple(s for s in servers if s is not server)

    def count_too(self, server: BoundedServer) -> None:
        """Another port of the process (node keys): /metrics shows its refusals too."""
        for mine in self.servers:
            mine.siblings = (*mine.siblings, server)

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

    def wait_idle(self, timeout: float) -> bool:
        """No request in progress on any port, within `timeout` seconds in all."""
        deadline = time.monotonic() + timeout
        return all(s.wait_idle(max(0.0, deadline - time.monotonic())) for s in self.servers)


@dataclass(frozen=True)
class Settings:
    """The ports and how they are served, checked (before anything else starts)."""

    scheduling: tuple[str, int]
    probes: tuple[str, int] | None  # None: on the scheduling port
    tls: CertificateFiles | None
    allowed: frozenset[str]
    limits: Limits
    probe_limits: Limits = PROBE_LIMITS


def settings_from(args: argparse.Namespace) -> Settings:
    """The flags checked: UsageError for an unsafe or incomplete set, TLSSetupError for TLS
    files that cannot be loaded."""
    shared = {
        "read_timeout": args.read_timeout,
        "handshake_timeout": args.handshake_timeout,
        "max_header_bytes": args.max_header_bytes,
        "max_header_line": min(args.max_header_bytes, DEFAULT_LIMITS.max_header_line),
    }
    limits = replace(
        SCHEDULING_LIMITS,
        max_body=args.max_body_bytes,
        max_connections=args.max_connections,
        max_per_client=args.max_connections_per_client,
        **shared,
    )
    probe_limits = replace(
        PROBE_LIMITS,
        max_connections=args.probe_max_connections,
        max_per_client=args.probe_max_connections_per_client,
        **shared,
    )
    allowed = frozenset(args.allowed_client or [KUBE_SCHEDULER])
    tls_files = (args.tls_cert, args.tls_key, args.tls_client_ca)
    tls = None
    if args.insecure_plain_http:
        if any(tls_files):
            raise UsageError("--insecure-plain-http and --tls-* exclude each other")
        allowed = frozenset()
    elif not all(tls_files):
        raise UsageError(
            "--tls-cert, --tls-key and --tls-client-ca are required: only kube-scheduler, with "
            "its client certificate, may call the extender (--insecure-plain-http for tests)"
        )
    else:
        tls = CertificateFiles(*tls_files, check_every=args.tls_reload_seconds)
    probes = _address("--probe-listen", args.probe_listen) if args.probe_listen else None
    scheduling = _address("--listen", args.listen)
    return Settings(scheduling, probes, tls, allowed, limits, probe_limits)


def open_endpoints(extender: Extender, settings: Settings) -> Endpoints:
    """Bind the ports."""
    tls, limits = settings.tls, settings.limits
    servers = [
        serve(extender, *settings.scheduling, tls=tls, allowed_clients=settings.allowed,
              probes=settings.probes is None, limits=limits, name="scheduling")
    ]  # fmt: skip
    if settings.probes is not None:
        servers.append(
            serve(
                extender,
                *settings.probes,
                scheduling=False,
                limits=settings.probe_limits,
                name="probes",
            )
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
