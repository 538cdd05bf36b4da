"""A small HTTP server speaking the Kubernetes list/watch protocol for one collection.

It keeps objects and a resourceVersion counter the way kube-apiserver does: a list is paged
with `limit`/`continue` and carries the collection's version; a watch from version V streams,
as chunked JSON lines, every event after V, then whatever happens next; a watch from a version
older than the last compaction gets `410 Gone` (as an ERROR event, or as the HTTP status when
the test asks). The test can also close open watches, inject raw bytes into them, and make
the next requests fail, so every branch of a list-then-watch client can be driven on purpose,
which a real API server does not let a test do on demand.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client

from hcsd.cluster.kube import Kube

PATH = "/api/v1/namespaces/test/things"


class WatchServer:
    def __init__(self, path: str = PATH) -> None:
        self.path = path
        self.cond = threading.Condition()
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.log: list[tuple[int, bytes]] = []  # (version, event line)
        self.compacted = 0  # watches from a version below this are told 410 Gone
        self.closing = 0  # bumped to end every open watch
        self.raw: list[bytes] = []  # bytes for the open watch, as they are
        self.fail: list[tuple[str, int]] = []  # ("list" | "watch", HTTP status) for next requests
        self.requests: list[tuple[str, dict[str, str]]] = []  # ("list" | "watch", query)
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.http.daemon_threads = True
        threading.Thread(target=self.http.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}"

    def kube(self) -> Kube:
        configuration = client.Configuration()
        configuration.host = self.url
        return Kube(client.ApiClient(configuration), timeout=5.0)

    def close(self) -> None:
        with self.cond:
            self.closing += 1
            self.cond.notify_all()
        self.http.shutdown()
        self.http.server_close()

    # --- the collection ------------------------------------------------------------------

    def _event(self, kind: str, obj: dict[str, Any], *, logged: bool = True) -> None:
        with self.cond:
            self.version += 1
            obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
            if kind == "DELETED":
                self.objects.pop(obj["metadata"]["name"], None)
            elif kind != "BOOKMARK":
                self.objects[obj["metadata"]["name"]] = obj
            if logged:
                line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                self.log.append((self.version, line))
            self.cond.notify_all()

    def put(self, name: str, *, meta: dict[str, Any] | None = None, **fields: Any) -> None:
        kind = "MODIFIED" if name in self.objects else "ADDED"
        metadata = {"name": name, "namespace": "test", **(meta or {})}
        self._event(kind, {"metadata": metadata, **fields})

    def delete(self, name: str) -> None:
        self._event("DELETED", self.objects[name])

    def bookmark(self) -> int:
        self._event("BOOKMARK", {"metadata": {"name": ""}})
        return self.version

    def change_unseen(self, puts: dict[str, dict[str, Any]], deletes: list[str]) -> None:
        """Changes no open watch sees, followed by a compaction: a watcher must list again."""
        with self.cond:
            for name in deletes:
                self._event("DELETED", self.objects[name], logged=False)
            for name, fields in puts.items():
                self._event(
                    "ADDED", {"metadata": {"name": name, "namespace": "test"}, **fields},
                    logged=False,
                )  # fmt: skip
            self.version += 1  # as writes elsewhere move the version on
            self.compacted = self.version
            self.closing += 1
            self.cond.notify_all()

    def inject(self, data: bytes) -> None:
        with self.cond:
            self.raw.append(data)
            self.cond.notify_all()

    def close_watches(self) -> None:
        with self.cond:
            self.closing += 1
            self.cond.notify_all()

    def count(self, kind: str) -> int:
        with self.cond:
            return sum(1 for k, _ in self.requests if k == kind)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": reason, "message": message}  # fmt: skip


def _handler(server: WatchServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _json(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            if url.path != server.path:
                self._json(404, _status(404, "NotFound", url.path))
                return
            kind = "watch" if query.get("watch") == "true" else "list"
            with server.cond:
                server.requests.append((kind, query))
                failing = next((f for f in server.fail if f[0] == kind), None)
                if failing is not None:
                    server.fail.remove(failing)
            if failing is not None:
                reason = "Expired" if failing[1] == 410 else "InternalError"
                self._json(failing[1], _status(failing[1], reason, f"{kind} refused by the test"))
            elif kind == "list":
                self._list(query)
            else:
                self._watch(int(query.get("resourceVersion") or 0))

        def _list(self, query: dict[str, str]) -> None:
            with server.cond:
                items = [server.objects[name] for name in sorted(server.objects)]
                version = server.version
            start = int(query.get("continue") or 0)
            limit = int(query.get("limit") or len(items) or 1)
            page = items[start : start + limit]
            token = str(start + limit) if start + limit < len(items) else ""
            meta = {"resourceVersion": str(version), "continue": token}
            self._json(200, {"kind": "List", "apiVersion": "v1", "items": page, "metadata": meta})

        def _watch(self, since: int) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            with server.cond:
                if since < server.compacted:
                    gone = _status(410, "Expired", f"too old resource version: {since}")
                    lines = [json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n"]
                    closing = -1
                else:
                    lines, closing = [], server.closing
            try:
                while True:
                    for line in lines:
                        self._chunk(line)
                    if closing == -1:
                        break
                    with server.cond:
                        server.cond.wait_for(
                            lambda: (
                                server.closing != closing
                                or server.raw
                                or any(v > since for v, _ in server.log[-50:])
                            ),
                            timeout=30,
                        )
                        if server.closing != closing:
                            break
                        lines = [line for v, line in server.log if v > since] + server.raw
                        server.raw.clear()
                        since = server.version
                self._chunk(b"")
            except OSError:
                pass  # the client went away

    return Handler
