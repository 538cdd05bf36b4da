"""A threading HTTP(S) server with limits: the transport under the extender's endpoints.

The standard library's `ThreadingHTTPServer` starts a thread per connection without bound,
does the TLS handshake in the accepting thread (one silent client stalls every other), lets a
client take as long as it likes to send a request (slowloris) and reads up to 100 header
lines of 64 KiB each. This one keeps its parsing and adds the limits (`Limits`):

- caps the connections served at once, in all and per source address: one more is closed at
  once and counted, so a flood costs sockets, not threads and memory, and one client cannot
  take every slot;
- does the TLS handshake in the connection's own thread, within `handshake_timeout` in all;
- gives a request `read_timeout` seconds, first byte to last (headers and body); the first
  request's clock starts when the connection is set up, so a silent connection is closed
  after `read_timeout` too. Only between requests on a kept-alive connection does it wait
  `idle_timeout` (longer than Go's 90 s idle pool, so kube-scheduler closes idle ones);
- caps the request line and headers (`max_header_bytes` in all, `max_header_line` a line):
  over that, 431 (414 for the request line) and the connection is closed;
- knows who is calling (`Connection.peer`) when the context asks for client certificates,
  and takes a new context for each handshake when given a function (certificate reload).

Body size is the handler's business (it knows the length before it reads).
"""

from __future__ import annotations

import http.client
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

from hcsd.logs import RepeatLimiter

__all__ = [
    "DEFAULT_LIMITS",
    "BoundedHandler",
    "BoundedServer",
    "DeadlineReader",
    "HeaderTooLarge",
    "Limits",
    "TLSSource",
]

log = logging.getLogger(__name__)
# Refusals name the client: a flood from one address writes ten lines a minute, not one a
# connection, whatever handler the process logs to.
log.addFilter(RepeatLimiter(log.handle, limit=10, interval=60.0))

TLSSource = ssl.SSLContext | Callable[[], ssl.SSLContext]  # a function: asked per handshake


@dataclass(frozen=True, slots=True)
class Limits:
    max_body: int = 4 * 1024 * 1024  # a pod (etcd keeps objects under 1.5 MiB) + node names
    max_connections: int = 64
    max_per_client: int = 8  # connections from one source address
    read_timeout: float = 10.0  # one request, first byte to last (the first: from connecting)
    idle_timeout: float = 120.0  # between requests on a kept-alive connection
    handshake_timeout: float = 3.0  # the TLS handshake, in all
    max_header_bytes: int = 32 * 1024  # request line and headers together
    max_header_line: int = 8 * 1024


DEFAULT_LIMITS = Limits()


class DeadlineReader(io.RawIOBase):
    """The socket as the handler's `rfile`. A request must come in whole within `budget`
    seconds: the first from when the connection is set up, a later one from its first byte.
    Between requests (`between_requests()`) a receive waits `idle` seconds."""

    def __init__(self, sock: socket.socket, idle: float, budget: float) -> None:
        super().__init__()
        self.sock = sock
        self.idle = idle
        self.budget = budget
        self.deadline: float | None = time.monotonic() + budget  # None: idle, kept alive

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


class HeaderTooLarge(http.client.LineTooLong):
    """The request line or headers over their limit (a `LineTooLong`, so that the standard
    library's header parser answers 431 for it)."""

    def __init__(self, message: str) -> None:
        http.client.HTTPException.__init__(self, message)


class HeaderReader(io.BufferedReader):
    """The buffered `rfile`: `readline`, which the standard library reads the request line
    and headers with (the body is `read`), draws on a budget that `new_request` refills."""

    def __init__(self, raw: DeadlineReader, *, line: int, total: int) -> None:
        super().__init__(raw, 64 * 1024)
        self.line = line
        self.total = total
        self.left = total
        self.tripped = False

    def new_request(self) -> None:
        self.left = self.total
        self.tripped = False

    def readline(self, size: int | None = -1) -> bytes:
        cap = min(self.line, self.left)
        if size is not None and 0 <= size < cap:
            cap = size
        text = super().readline(cap + 1)
        if len(text) > cap:
            self.tripped = True
            if cap < self.line:
                raise HeaderTooLarge(f"request headers over {self.total} bytes")
            raise HeaderTooLarge(f"a request header line over {self.line} bytes")
        self.left -= len(text)
        return text


class BoundedHandler(BaseHTTPRequestHandler):
    """Reads requests under the server's `Limits`; subclasses add the `do_*` methods."""

    protocol_version = "HTTP/1.1"
    server: BoundedServer
    rfile: HeaderReader
    _reader: DeadlineReader
    _requests: int = 0
    _busy: bool = False  # a request read, its answer not yet written

    def setup(self) -> None:
        super().setup()
        limits = self.server.limits
        self._reader = DeadlineReader(self.connection, limits.idle_timeout, limits.read_timeout)
        self.rfile = HeaderReader(
            self._reader, line=limits.max_header_line, total=limits.max_header_bytes
        )

    def parse_request(self) -> bool:
        """Called once the request line is in: from here to its answer the request is in
        flight (`BoundedServer.wait_idle`); the wait for it on a kept-alive connection is not."""
        if not self._busy:
            self._busy = True
            self.server.began()
        return super().parse_request()

    def handle_one_request(self) -> None:
        if self._requests:
            self._reader.between_requests()
        self._requests += 1
        self.rfile.new_request()
        try:
            super().handle_one_request()  # 431 for headers over the limit (parse_request)
        except HeaderTooLarge as e:  # the request line, read before parse_request
            self.requestline, self.request_version, self.command = "", "", ""
            self.close_connection = True
            self.send_error(414, str(e))
        finally:
            if self._busy:
                self._busy = False
                self.server.ended()
            if self.rfile.tripped:  # counted even when the client is gone before the answer
                self.server.count_refusal("headers")
                log.info("%s: %s: request headers over the limit", self.server.name,
                         self.client_address[0])  # fmt: skip


class BoundedServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # the listen backlog (socketserver's 5 drops a burst's SYNs)

    def __init__(
        self,
        address: tuple[str, int],
        handler: Callable[[Any, Any, Any], BaseHTTPRequestHandler],
        *,
        tls: TLSSource | None = None,
        limits: Limits = DEFAULT_LIMITS,
        name: str = "http",
    ) -> None:
        super().__init__(address, handler)
        self.tls = tls
        self.limits = limits
        self.name = name
        self.refused: Counter[str] = Counter()  # connections closed unserved, by reason
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()  # connections being served, by source address
        self._in_flight = 0  # requests read and not yet answered
        self._idle = threading.Condition(self._lock)

    def began(self) -> None:
        with self._lock:
            self._in_flight += 1

    def ended(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait (up to `timeout` seconds) until no request is being answered; True when none
        is. Handler threads are daemons that outlive `shutdown`: a process that gives up a
        Lease on its way out waits for them first (a bind half done is the leader's write)."""
        with self._lock:
            return self._idle.wait_for(lambda: not self._in_flight, timeout)

    def count_refusal(self, reason: str) -> None:
        """From any thread (a Counter's `+=` is not atomic)."""
        with self._lock:
            self.refused[reason] += 1

    def _admit(self, host: str) -> str | None:
        """Take a slot for a connection from `host`, or say which limit it is over."""
        with self._lock:
            if self._open.total() >= self.limits.max_connections:
                return "connections"
            if self._open[host] >= self.limits.max_per_client:
                return "client"
            self._open[host] += 1
            return None

    def _release(self, host: str) -> None:
        with self._lock:
            self._open[host] -= 1
            if self._open[host] <= 0:
                del self._open[host]

    def process_request(self, request: Any, client_address: Any) -> None:
        host = str(client_address[0])
        over = self._admit(host)
        if over is not None:
            self.count_refusal(over)
            if over == "client":
                log.warning(
                    "%s: %s has %d connections open, the limit per client: closing new ones",
                    self.name, host, self.limits.max_per_client,
                )  # fmt: skip
            elif self.refused[over] in (1, 10, 100) or not self.refused[over] % 1000:
                log.warning(
                    "%s: %d connections open, the limit: closing new ones (%d so far)",
                    self.name, self.limits.max_connections, self.refused[over],
                )  # fmt: skip
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(host)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(str(client_address[0]))

    def finish_request(self, request: Any, client_address: Any) -> None:
        server: Any = self  # the handler's type names the subclass (socketserver's Self)
        if self.tls is None:
            request.settimeout(self.limits.read_timeout)
            self.RequestHandlerClass(request, client_address, server)
            return
        context = self.tls if isinstance(self.tls, ssl.SSLContext) else self.tls()
        # CPython's handshake keeps one deadline for all its reads and writes: a client that
        # dribbles its hello a byte at a time is cut off all the same.
        request.settimeout(self.limits.handshake_timeout)
        try:
            secured = context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            self.count_refusal("tls")
            log.info("%s: TLS handshake with %s refused: %s", self.name, client_address[0], e)
            return
        secured.settimeout(self.limits.read_timeout)  # a handler of its own reads under it
        try:
            self.RequestHandlerClass(secured, client_address, server)
        finally:
            secured.close()
