"""TLS for the cluster side's HTTPS endpoints: a server context from PEM files, and the peer.

kube-scheduler calls the extender with the client certificate named in its
KubeSchedulerConfiguration's `extenders[].tlsConfig`; the extender checks it against a client
CA and then the certificate's name against the names it serves (`peer_of`, then the caller's
own allow-list). Any endpoint of the cluster side that must know its caller builds its context
here, so they all refuse the same things the same way: TLS 1.2 at least, no renegotiation,
with a client CA no connection at all without a certificate that CA signed, and no name read
from a certificate that carries more or less than one CN (Go, and so Kubernetes, takes the
last, Python's first: with one there is nothing to disagree on).

cert-manager renews a Secret in place and the kubelet swaps the mounted files under a running
pod: `CertificateFiles` rebuilds the context when the files change, for the next handshakes.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CertificateFiles",
    "Peer",
    "PeerError",
    "TLSSetupError",
    "peer_of",
    "server_context",
]

log = logging.getLogger(__name__)


class TLSSetupError(ValueError):
    """A certificate, key or CA file that cannot be used (permanent: fix the files)."""


class PeerError(ValueError):
    """A verified client certificate whose name cannot be read unambiguously."""


@dataclass(frozen=True, slots=True)
class Peer:
    """Who presented a verified client certificate: its subject's CN and O values, as
    Kubernetes reads a client certificate (user name, groups)."""

    common_name: str
    organizations: tuple[str, ...]


def server_context(cert: str, key: str, client_ca: str = "") -> ssl.SSLContext:
    """A server context for `cert`/`key` (PEM). With `client_ca`, a client must present a
    certificate that CA signed, or the handshake fails: no request is ever read from it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_RENEGOTIATION  # TLS 1.2: no client-started handshakes later
    try:
        context.load_cert_chain(cert, key or None)
    except (OSError, ssl.SSLError) as e:
        raise TLSSetupError(f"failed to load the serving certificate {cert}: {e}") from e
    if client_ca:
        try:
            context.load_verify_locations(cafile=client_ca)
        except (OSError, ssl.SSLError) as e:
            raise TLSSetupError(f"failed to load the client CA {client_ca}: {e}") from e
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class CertificateFiles:
    """`server_context` for files that may be replaced under the process: calling it returns
    the context for the files as they are, looked at (stat) at most every `check_every`
    seconds. A change that does not load (half-written, mismatched) keeps the last good
    context and is logged; the next change is tried again."""

    def __init__(
        self,
        cert: str,
        key: str,
        client_ca: str = "",
        *,
        check_every: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.paths = tuple(p for p in (cert, key, client_ca) if p)
        self.files = (cert, key, client_ca)
        self.check_every = check_every
        self.clock = clock
        self._lock = threading.Lock()
        self._seen = self._stamp()
        self.context = server_context(*self.files)  # the first load's failure is the caller's
        self._next_check = clock() + check_every

    def _stamp(self) -> tuple[tuple[int, int, int], ...]:
        """What tells a replaced file apart (the kubelet swaps a symlink: a new inode)."""
        stamps = []
        for path in self.paths:
            try:
                status = os.stat(path)
            except OSError:
                stamps.append((0, 0, -1))
                continue
            stamps.append((status.st_ino, status.st_mtime_ns, status.st_size))
        return tuple(stamps)

    def __call__(self) -> ssl.SSLContext:
        with self._lock:
            now = self.clock()
            if now < self._next_check:
                return self.context
            self._next_check = now + self.check_every
            stamp = self._stamp()
            if stamp == self._seen:
                return self.context
            self._seen = stamp
            try:
                self.context = server_context(*self.files)
            except TLSSetupError as e:
                log.warning("TLS files changed but cannot be used, keeping the last: %s", e)
            else:
                log.info("TLS files changed: new handshakes use %s", self.files[0])
            return self.context


def _names(subject: Any, attribute: str) -> list[str]:
    return [
        str(value)
        for rdn in subject or ()
        for name, value in rdn
        if name == attribute  # getpeercert()'s ((("commonName", "x"),), ...)
    ]


def peer_of(connection: object) -> Peer | None:
    """The verified client certificate's names, or None (plain socket, or no certificate).
    PeerError for a certificate without exactly one CN."""
    if not isinstance(connection, ssl.SSLSocket):
        return None
    cert = connection.getpeercert()
    if not cert:
        return None
    subject = cert.get("subject")
    common = _names(subject, "commonName")
    if len(common) != 1:
        raise PeerError(
            f"the client certificate carries {len(common)} CNs: exactly one is accepted"
        )
    return Peer(common[0], tuple(_names(subject, "organizationName")))
