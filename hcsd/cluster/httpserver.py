"""A threading HTTP(S) server with limits: the transport under the extender's endpoints.

The standard library's `ThreadingHTTPServer` starts a thread per connection without bound,
does the TLS handshake in the accepting thread (one silent client stalls every other) and
lets a client take as long as it likes to send a request (slowloris). This one:

- caps the connections served at once (`Limits.max_connections`): one more is closed at once
  and counted, so a flood costs sockets, not threads and memory;
- does the TLS handshake in the connection's own thread, under the read timeout;
- gives a request `Limits.read_timeout` seconds from its first byte to its last (headers and
  body), and an idle keep-alive connection `Limits.idle_timeout` seconds between requests
  (longer than Go's 90 s idle pool, so kube-scheduler, not the server, closes idle ones);
- knows who is calling (`Connection.peer`) when the context asks for client certificates.

Body size is the handler's business (it knows the length before it reads).
"""

from __future__ import annotations

import io
import logging
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["DEFAULT_LIMITS", "BoundedServer", "DeadlineReader", "Limits"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Limits:
    max_body: int = 4 * 1024 * 1024  # a pod (etcd keeps objects under 1.5 MiB) + node names
    max_connections: int = 64
    read_timeout: float = 10.0  # one request, first byte to last
    idle_timeout: float = 120.0  # between requests on a kept-alive connection


DEFAULT_LIMITS = Limits()


class DeadlineReader(io.RawIOBase):
    """The socket as the handler's `rfile`: between requests a receive waits `idle` seconds;
    once a request's first bytes are in, the rest must come within `budget` seconds in all,
    however it is dribbled. `between_requests()` starts the next request's clock."""

    def __init__(self, sock: socket.socket, idle: float, budget: float) -> None:
        super().__init__()
        self.sock = sock
        self.idle = idle
        self.budget = budget
        self.deadline: float | None = None  # None: waiting for a request to start

    def readable(self) -> bool:
        return True

    def between_requests(self) -> None:
        self.deadline = None

    def readinto(self, buffer: Any) -> int:
        if self.deadline is None:
            self.sock.settimeout(self.idle)
        else:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the request was not sent within {self.budget:g} s")
            self.sock.settimeout(left)
        count = self.sock.recv_into(buffer)
        if self.deadline is None and count:
            self.deadline = time.monotonic() + self.budget
        return count


class BoundedServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: Callable[[Any, Any, Any], BaseHTTPRequestHandler],
        *,
        tls: ssl.SSLContext | None = None,
        limits: Limits = DEFAULT_LIMITS,
        name: str = "http",
    ) -> None:
        super().__init__(address, handler)
        self.tls = tls
        self.limits = limits
        self.name = name
        self.refused: Counter[str] = Counter()  # connections closed unserved, by reason
        self._slots = threading.BoundedSemaphore(limits.max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused["connections"] += 1
            if (
                self.refused["connections"] in (1, 10, 100)
                or not self.refused["connections"] % 1000
            ):
                log.warning(
                    "%s: %d connections open, the limit: closing new ones (%d so far)",
                    self.name,
                    self.limits.max_connections,
                    self.refused["connections"],
                )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(self.limits.read_timeout)  # bounds each step of the handshake
        server: Any = self  # the handler's type names the subclass (socketserver's Self)
        if self.tls is None:
            self.RequestHandlerClass(request, client_address, server)
            return
        try:
            secured = self.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            self.refused["tls"] += 1
            log.info("%s: TLS handshake with %s refused: %s", self.name, client_address[0], e)
            return
        try:
            self.RequestHandlerClass(secured, client_address, server)
        finally:
            secured.close()
