"""A small HTTP server that keeps Kubernetes objects by path, for get, create, replace and
merge-patch, the way kube-apiserver answers them: every write bumps a resourceVersion; a get of
what is not there is 404; a create of what is there, or a replace carrying a stale
resourceVersion, is 409; `…/status` replaces only the status and other writes keep it (the
status subresource). The test can write objects as another client would, make the next
requests of a method fail with a status of its choice, and count what was asked: so the
leader's and the syncer's handling of races and outages can be driven on purpose, which a
real API server does not let a test do on demand (tests/cluster runs them against one).
"""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client

from hcsd.cluster.kube import Kube

_REASONS = {404: "NotFound", 409: "Conflict", 500: "InternalError", 503: "ServiceUnavailable"}


def _status(code: int, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": _REASONS.get(code, "Unknown"), "message": message}  # fmt: skip


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


class ObjectServer:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 0
        self._refusals: list[tuple[str, int, str]] = []  # (method, status, path prefix)
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status answered)
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.http.daemon_threads = True
        threading.Thread(target=self.http.serve_forever, args=(0.05,), daemon=True).start()

    def kube(self) -> Kube:
        configuration = client.Configuration()
        configuration.host = f"http://127.0.0.1:{self.http.server_address[1]}"
        return Kube(client.ApiClient(configuration), timeout=5.0)

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()

    def refuse(self, method: str, status: int, path: str = "", times: int = 1) -> None:
        """Answer the next `times` requests of `method` (under `path`) with `status`."""
        with self.lock:
            self._refusals += [(method, status, path)] * times

    def get(self, path: str) -> dict[str, Any] | None:
        with self.lock:
            found = self.objects.get(path)
            return copy.deepcopy(found) if found is not None else None

    def store(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Write `obj` at `path` as another client would (a new resourceVersion)."""
        with self.lock:
            return copy.deepcopy(self._store(path, obj))

    def delete(self, path: str) -> None:
        with self.lock:
            self.objects.pop(path, None)

    def count(self, method: str, path: str = "") -> int:
        with self.lock:
            return sum(1 for m, p, _ in self.requests if m == method and p.startswith(path))

    def refused(self, status: int, path: str = "") -> int:
        """How many requests (under `path`) were answered with `status`."""
        with self.lock:
            return sum(1 for _, p, s in self.requests if s == status and p.startswith(path))

    def _store(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored = copy.deepcopy(obj)
        stored.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.objects[path] = stored
        return stored

    def answer(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        with self.lock:
            failing = next(
                (f for f in self._refusals if f[0] == method and path.startswith(f[2])), None
            )
            if failing is not None:
                self._refusals.remove(failing)
                status, answer = failing[1], _status(failing[1], f"{method} {path}: by the test")
            else:
                status, answer = self._answer(method, path, body)
            self.requests.append((method, path, status))
            return status, answer

    def _answer(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        if method == "POST":
            name = ((body or {}).get("metadata") or {}).get("name", "")
            target = f"{path}/{name}"
            if target in self.objects:
                return 409, _status(409, f"{name} already exists")
            return 201, self._store(target, body)
        status_only = path.endswith("/status")
        target = path.removesuffix("/status")
        stored = self.objects.get(target)
        if stored is None:
            return 404, _status(404, f"{target} not found")
        if method == "GET":
            return 200, stored
        if method == "PATCH":
            updated = {**merge_patch(stored, body), "status": stored.get("status")}
            return 200, self._store(target, _present(updated))
        if method != "PUT":
            return 405, _status(405, method)
        sent = (body.get("metadata") or {}).get("resourceVersion")
        if sent is not None and sent != stored["metadata"]["resourceVersion"]:
            return 409, _status(409, f"{target}: the object has been modified")
        if status_only:
            updated = {**stored, "status": body.get("status")}
        else:
            updated = {**body, "status": stored.get("status")}
        return 200, self._store(target, _present(updated))


def _present(obj: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in obj.items() if value is not None}


def _handler(server: ObjectServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            status, answer = server.answer(self.command, self.path.split("?")[0], body)
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = _serve

    return Handler
