"""BoundedServer.wait_idle: a process that gives up its Lease on the way out waits for the
requests being answered (a bind is the leader's write), not for idle kept-alive connections."""

from __future__ import annotations

import http.client
import threading
import time

from hcsd.cluster.httpserver import BoundedHandler, BoundedServer

release = threading.Event()
entered = threading.Event()


class Slow(BoundedHandler):
    def do_POST(self) -> None:
        if self.path == "/slow":
            entered.set()
            release.wait(10)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_wait_idle_waits_for_a_request_in_progress_not_for_kept_alive_connections() -> None:
    server = BoundedServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    kept = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        kept.request("POST", "/fast", body=b"")
        assert kept.getresponse().read() == b""
        assert server.wait_idle(0.1)  # a kept-alive connection between requests: idle

        def slow() -> None:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("POST", "/slow", body=b"")
            c.getresponse().read()
            c.close()

        caller = threading.Thread(target=slow)
        caller.start()
        assert entered.wait(5)
        server.shutdown()  # the handler's thread outlives the server loop
        started = time.monotonic()
        assert not server.wait_idle(0.3)
        assert 0.25 < time.monotonic() - started < 2
        release.set()
        assert server.wait_idle(5)
        caller.join(5)
    finally:
        release.set()
        kept.close()
        server.server_close()
