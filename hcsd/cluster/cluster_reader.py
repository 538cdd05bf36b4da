"""Reading the cluster view from the API server, with the credentials kubectl would use.

Where the credentials come from, in kubectl's order: `--kubeconfig`, `$KUBECONFIG` (several
files, `:`-separated, merged), `~/.kube/config`, else the pod's service account. Three lists,
all read-only: ComputeNodes, the Pending pods of every namespace, ComputeQuotas. Each failure
becomes one sentence that says what to do: no kubeconfig, an API server that does not answer,
the CRDs not installed, or the RBAC verb the user lacks (the `hcs-viewer` ClusterRole grants
them all).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hcsd.cluster.cluster_view import ClusterView, Source, summarise
from hcsd.cluster.kube import Kube, KubeError, paths_for
from hcsd.cluster.kubeconfig import KubeconfigError
from hcsd.contract.names import API_VERSION, COMPUTE_NODES, COMPUTE_QUOTAS, GROUP

__all__ = ["VIEWER_ROLE", "ViewError", "connect", "find_kubeconfig", "read_view"]

VIEWER_ROLE = "hcs-viewer"  # packaging/kubernetes/rbac-viewer.yaml
_IN_CLUSTER = "KUBERNETES_SERVICE_HOST"


class ViewError(Exception):
    """The view cannot be read; the message says why and what to do."""


def find_kubeconfig(explicit: str | None, environ: Mapping[str, str], home: Path) -> str | None:
    """The kubeconfig path(s) kubectl would read, or None for the in-cluster account.

    As kubectl: files in $KUBECONFIG that are missing or empty are skipped, and when none is
    left a pod falls back to its service account."""
    if explicit:
        if not Path(explicit).is_file():
            raise ViewError(f"no kubeconfig at {explicit} (--kubeconfig)")
        return explicit
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        present = [p for p in listed if Path(p).is_file() and Path(p).stat().st_size > 0]
        if present:
            return os.pathsep.join(present)
        if environ.get(_IN_CLUSTER):
            return None
        raise ViewError(f"none of the files in $KUBECONFIG exists: {', '.join(listed)}")
    default = home / ".kube" / "config"
    if default.is_file() and default.stat().st_size > 0:
        return str(default)
    if environ.get(_IN_CLUSTER):
        return None
    raise ViewError(
        f"no kubeconfig: give --kubeconfig, set $KUBECONFIG or write {default} "
        "(or run in a pod with a service account)"
    )


def connect(
    kubeconfig: str | None, context: str | None, *, timeout: float = 10.0
) -> tuple[Kube, Source]:
    """A client for the cluster kubectl would talk to (`kubeconfig` from find_kubeconfig).
    Every way the configuration can fail to load is one ViewError, never a traceback."""
    from kubernetes.config import ConfigException  # with Kube: only when a view is asked for

    if kubeconfig is None and context:
        raise ViewError(
            f"--context {context} needs a kubeconfig: none was found, and in a pod the "
            "service account is used (give --kubeconfig or set $KUBECONFIG)"
        )
    where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster configuration"
    try:
        kube = Kube.connect(kubeconfig, context=context, timeout=timeout)
    except KubeconfigError as e:
        raise ViewError(str(e)) from e
    except (ConfigException, OSError) as e:
        raise ViewError(f"failed to load {where}: {e}") from e
    except (ValueError, TypeError, KeyError, AttributeError) as e:  # binascii.Error: ValueError
        raise ViewError(f"failed to load {where}: {type(e).__name__}: {e}") from e
    server = str(kube.api.configuration.host)
    return kube, Source(server, kubeconfig or "", context or "")


# What each list needs: (path, RBAC verb and resource, scope), and what a 404 means.
_READS = {
    "computenodes": (
        paths_for(API_VERSION, COMPUTE_NODES),
        f"list {COMPUTE_NODES}.{GROUP} (cluster-scoped)",
        f"the ComputeNode CRD ({COMPUTE_NODES}.{GROUP})",
    ),
    "pods": ("/api/v1/pods", "list pods in all namespaces", ""),
    "computequotas": (
        paths_for(API_VERSION, COMPUTE_QUOTAS),
        f"list {COMPUTE_QUOTAS}.{GROUP} in all namespaces",
        f"the ComputeQuota CRD ({COMPUTE_QUOTAS}.{GROUP})",
    ),
}


def _list(kube: Kube, source: Source, what: str) -> list[dict[str, Any]]:
    path, verb, crd = _READS[what]
    query = [("fieldSelector", "status.phase=Pending")] if what == "pods" else []
    try:
        items, _ = kube.list_all(path, query)
    except KubeError as e:
        raise _explain(e, source, verb, crd) from e
    return items


def _explain(e: KubeError, source: Source, verb: str, crd: str) -> ViewError:
    if e.status == 0:
        return ViewError(f"cannot reach the API server at {source.server}: {e}")
    if e.status == 401:
        return ViewError(f"the API server at {source.server} did not accept the credentials: {e}")
    if e.status == 403:
        return ViewError(
            f"forbidden: RBAC does not let you {verb}; the ClusterRole "
            f"{VIEWER_ROLE} grants what this view reads (kubectl create clusterrolebinding "
            f"... --clusterrole={VIEWER_ROLE} --user=...). The API server said: {e}"
        )
    if e.status == 404 and crd:
        return ViewError(
            f"{crd} is not installed in the cluster at {source.server}: "
            "kubectl apply -k /usr/share/hcsd/kubernetes (docs/cluster.md, Install)"
        )
    return ViewError(f"failed to {verb}: {e}")


def read_view(kube: Kube, source: Source) -> ClusterView:
    """List what the view needs (three lists, paged) and summarise it."""
    nodes = _list(kube, source, "computenodes")
    quotas = _list(kube, source, "computequotas")
    pods = _list(kube, source, "pods")
    return summarise(nodes, pods, quotas)
