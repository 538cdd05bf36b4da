"""A small JSON client for the Kubernetes API, on top of the `kubernetes` package.

The package gives us what is hard to get right: kubeconfig and in-cluster loading, client
certificates, token refresh, proxies. Its typed models are not used: the cluster side reads
and writes plain dicts (ComputeNodes are custom objects anyway, and decoding thousands of pods
into models would cost more than the scheduling decisions). Watches are read line by line from
the streaming response.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import urllib3
from kubernetes import client, config

from hcsd.cluster.kubeconfig import KubeconfigError, merge_files

__all__ = ["Kube", "KubeError"]

log = logging.getLogger(__name__)

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    """A request the API server refused (status >= 400) or could not be reached for."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status = status  # 0: no answer (connection refused, timeout)
        self.reason = reason

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def gone(self) -> bool:
        return self.status == 410


class Kube:
    """Requests by path: `kube.get("/api/v1/namespaces/x/pods/y")`."""

    def __init__(self, api_client: client.ApiClient, *, timeout: float = 10.0) -> None:
        self.api = api_client
        self.timeout = timeout

    @classmethod
    def connect(
        cls, kubeconfig: str | None = None, *, context: str | None = None, timeout: float = 10.0
    ) -> Kube:
        """From a kubeconfig file (several, `:`-separated, are merged as kubectl does: see
        `kubeconfig`) and its `context` (None: the current one), or the pod's service account
        when there is none. Raises KubeconfigError, or the package's ConfigException (and
        ValueError for bad base64 data) when the merged configuration does not load."""
        configuration = client.Configuration()
        if kubeconfig:
            merged = merge_files(kubeconfig.split(os.pathsep))
            if merged is None:
                raise KubeconfigError(f"kubeconfig {kubeconfig} is empty")
            # persist_config=False: the client never writes (refreshed tokens) to the files.
            config.load_kube_config_from_dict(  # type: ignore[no-untyped-call]
                merged,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        else:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        return cls(client.ApiClient(configuration), timeout=timeout)

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = JSON,
        timeout: float | tuple[float, float] | None = None,
        accept: str = JSON,
    ) -> Any:
        headers = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = content_type
        url_path = path + ("?" + urllib.parse.urlencode(list(query)) if query else "")
        _, url, headers, _, _ = self.api.param_serialize(
            method, url_path, header_params=headers, auth_settings=["BearerToken"]
        )
        payload = None if body is None else json.dumps(body, separators=(",", ":"))
        # (connect, read): a watch reads for minutes; urllib3's first positional is "total".
        connect, read = timeout if isinstance(timeout, tuple) else (timeout or self.timeout,) * 2
        if payload is not None:
            headers["Content-Length"] = str(len(payload.encode()))
        try:
            response = self.api.rest_client.pool_manager.request(
                method,
                url,
                body=payload,
                headers=headers,
                timeout=urllib3.Timeout(connect=connect, read=read),
                preload_content=False,
                retries=False,
            )
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeError(0, "Unreachable", f"{method} {path}: {e}") from e
        return response

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = JSON,
        accept: str = JSON,
    ) -> dict[str, Any]:
        """One call; `accept` can ask for another rendering (a Table, as kubectl does)."""
        response = self._send(
            method, path, query=query, body=body, content_type=content_type, accept=accept
        )
        try:
            data = response.read()
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeError(0, "Unreachable", f"{method} {path}: {e}") from e
        finally:
            response.release_conn()
        if response.status >= 400:
            raise _error(response.status, data, f"{method} {path}")
        decoded: dict[str, Any] = json.loads(data) if data else {}
        return decoded

    def get(self, path: str, query: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
        return self.request("GET", path, query=query)

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, body=body)

    def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("PUT", path, body=body)

    def patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", path, body=body, content_type=MERGE_PATCH)

    def list_all(
        self, path: str, query: Sequence[tuple[str, str]] = (), *, page: int = 500
    ) -> tuple[list[dict[str, Any]], str]:
        """Every item (in pages, so a big list does not time out) and the list's version."""
        items: list[dict[str, Any]] = []
        last = ""
        for chunk, seen in self.pages(path, query, page=page):
            items.extend(chunk)
            last = seen
        return items, last

    def pages(
        self, path: str, query: Sequence[tuple[str, str]] = (), *, page: int = 500
    ) -> Iterator[tuple[list[dict[str, Any]], str]]:
        """The list a page at a time, with the list's version: a caller that keeps only a few
        facts of each item holds one page in memory, not the whole list."""
        token = ""
        while True:
            params = [*query, ("limit", str(page))] + ([("continue", token)] if token else [])
            answer = self.get(path, params)
            meta = answer.get("metadata") or {}
            token = meta.get("continue") or ""
            yield list(answer.get("items") or []), str(meta.get("resourceVersion", ""))
            if not token:
                return

    def watch(
        self,
        path: str,
        resource_version: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        timeout_seconds: int = 300,
    ) -> Iterator[dict[str, Any]]:
        """Watch events from `resource_version` on; ends when the server closes the watch.

        Raises KubeError(410) when the version is too old: the caller lists again.
        """
        params = [
            *query,
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        response = self._send(
            "GET", path, query=params, timeout=(self.timeout, timeout_seconds + 30)
        )
        try:
            if response.status >= 400:
                raise _error(response.status, response.read(), f"watch {path}")
            pending = b""
            for chunk in response.stream(64 * 1024, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise KubeError(
                            int(status.get("code", 500)),
                            str(status.get("reason", "")),
                            str(status.get("message", "watch error")),
                        )
                    yield event
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeError(0, "Unreachable", f"watch {path}: {e}") from e
        finally:
            response.release_conn()


def _error(status: int, data: bytes, what: str) -> KubeError:
    try:
        body = json.loads(data)
        return KubeError(status, str(body.get("reason", "")), f"{what}: {body.get('message', '')}")
    except (ValueError, AttributeError):
        return KubeError(status, "", f"{what}: {data[:300]!r}")


def lease_object(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A coordination.k8s.io/v1 Lease: the syncers' heartbeats and the extender's leader."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def paths_for(group_version: str, plural: str, namespace: str = "", name: str = "") -> str:
    """`/apis/hcs.io/v1alpha1/namespaces/ns/computequotas/name` and friends."""
    base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{ns}/{plural}" + (f"/{name}" if name else "")


logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
