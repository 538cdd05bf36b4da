"""TLS for the cluster side's HTTPS endpoints: a server context from PEM files, and the peer.

kube-scheduler calls the extender with the client certificate named in its
KubeSchedulerConfiguration's `extenders[].tlsConfig`; the extender checks it against a client
CA and then the certificate's name against the names it serves (`peer_of`, then the caller's
own allow-list). Any endpoint of the cluster side that must know its caller builds its context
here, so they all refuse the same things the same way: TLS 1.2 at least, and with a client CA,
no connection at all without a certificate that CA signed.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

__all__ = ["Peer", "TLSSetupError", "peer_of", "server_context"]


class TLSSetupError(ValueError):
    """A certificate, key or CA file that cannot be used (permanent: fix the files)."""


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


def _names(subject: Any, attribute: str) -> list[str]:
    return [
        str(value)
        for rdn in subject or ()
        for name, value in rdn
        if name == attribute  # getpeercert()'s ((("commonName", "x"),), ...)
    ]


def peer_of(connection: object) -> Peer | None:
    """The verified client certificate's names, or None (plain socket, or no certificate)."""
    if not isinstance(connection, ssl.SSLSocket):
        return None
    cert = connection.getpeercert()
    if not cert:
        return None
    subject = cert.get("subject")
    common = _names(subject, "commonName")
    return Peer(common[0] if common else "", tuple(_names(subject, "organizationName")))
