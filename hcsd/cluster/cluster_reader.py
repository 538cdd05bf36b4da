"""Reading the cluster view from the API server, with the credentials kubectl would use.

Where the credentials come from, in kubectl's order: `--kubeconfig`, `$KUBECONFIG` (several
files, `:`-separated, merged), `~/.kube/config`, else the pod's service account. Four lists,
all read-only: ComputeNodes, ComputeQuotas, the heartbeat Leases in hcs-system and the Pending
pods (of every namespace, or of one). Each failure becomes one sentence that says what to do:
no kubeconfig or a broken one, an API server that does not answer, credentials it did not
take, the CRDs not installed, or the RBAC verb the user lacks (the `hcs-viewer` ClusterRole
and Role grant the first three; pods, which expose every pod's spec, need `hcs-viewer-pods`,
and without them the view shows the rest and says the pods are not shown).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hcsd.cluster.cluster_view import ClusterView, Source, summarise
from hcsd.cluster.kube import Kube, KubeError, paths_for
from hcsd.cluster.kubeconfig import KubeconfigError
from hcsd.contract.names import API_VERSION, COMPUTE_NODES, COMPUTE_QUOTAS, GROUP, NAMESPACE

__all__ = [
    "VIEWER_PODS_ROLE",
    "VIEWER_ROLE",
    "ViewError",
    "connect",
    "find_kubeconfig",
    "read_view",
]

VIEWER_ROLE = "hcs-viewer"  # packaging/kubernetes/rbac-viewer.yaml: ClusterRole and Role
VIEWER_PODS_ROLE = "hcs-viewer-pods"  # the pods, apart: they expose every pod's spec
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


# What each list needs: (path, RBAC verb and resource, what a 404 means).
_READS = {
    "computenodes": (
        paths_for(API_VERSION, COMPUTE_NODES),
        f"list {COMPUTE_NODES}.{GROUP} (cluster-scoped)",
        f"the ComputeNode CRD ({COMPUTE_NODES}.{GROUP})",
    ),
    "leases": (
        paths_for("coordination.k8s.io/v1", "leases", NAMESPACE),
        f"list leases.coordination.k8s.io in {NAMESPACE} (the nodes' heartbeats)",
        "",
    ),
    "computequotas": (
        paths_for(API_VERSION, COMPUTE_QUOTAS),
        f"list {COMPUTE_QUOTAS}.{GROUP} in all namespaces",
        f"the ComputeQuota CRD ({COMPUTE_QUOTAS}.{GROUP})",
    ),
}


def _list(
    kube: Kube, source: Source, what: str, path: str = "", verb: str = ""
) -> list[dict[str, Any]]:
    default_path, default_verb, crd = _READS.get(what, ("", "", ""))
    path, verb = path or default_path, verb or default_verb
    query = [("fieldSelector", "status.phase=Pending")] if what == "pods" else []
    try:
        items, _ = kube.list_all(path, query)
    except KubeError as e:
        raise _explain(e, source, verb, crd) from e
    return items


def _anonymous(e: KubeError) -> bool:
    return e.status == 401 or (e.status == 403 and "system:anonymous" in str(e))


def _explain(e: KubeError, source: Source, verb: str, crd: str) -> ViewError:
    if e.status == 0:
        return ViewError(f"cannot reach the API server at {source.server}: {e}")
    if _anonymous(e):
        return ViewError(
            f"not authenticated to the API server at {source.server} (the kubeconfig's "
            f"credential plugin failed, see above, or its credentials were refused): {e}"
        )
    if e.status == 403:
        subject = "--user=..."
        if not source.kubeconfig:  # a pod: its service account asks
            subject = "--serviceaccount=<namespace>:<name>"
        return ViewError(
            f"forbidden: RBAC does not let you {verb}; the ClusterRole "
            f"{VIEWER_ROLE} grants what this view reads (kubectl create clusterrolebinding "
            f"... --clusterrole={VIEWER_ROLE} {subject}). The API server said: {e}"
        )
    if e.status == 404 and crd:
        return ViewError(
            f"{crd} is not installed in the cluster at {source.server}: "
            "kubectl apply -k /usr/share/hcsd/kubernetes (docs/cluster.md, Install)"
        )
    return ViewError(f"failed to {verb}: {e}")


_GRANTS = {
    "leases": f"the Role {VIEWER_ROLE} in {NAMESPACE}",
    "pods": f"the ClusterRole {VIEWER_PODS_ROLE}",
}


def _optional(
    kube: Kube, source: Source, what: str, path: str = "", verb: str = ""
) -> tuple[list[dict[str, Any]] | None, str]:
    """A list the view can do without: (None, why) when RBAC refuses it."""
    try:
        return _list(kube, source, what, path, verb), ""
    except ViewError as e:
        cause = e.__cause__
        if isinstance(cause, KubeError) and cause.status == 403 and not _anonymous(cause):
            grant = _GRANTS[what]
            return None, f"cannot {verb or _READS[what][1]}; {grant} grants it"
        raise


def read_view(
    kube: Kube, source: Source, *, namespace: str | None = None, now: float | None = None
) -> ClusterView:
    """List what the view needs (paged) and summarise it. The Pending pods of `namespace`
    (None: of all namespaces) and the heartbeat Leases are optional: without the right to
    list them the view says so and shows the rest."""
    nodes = _list(kube, source, "computenodes")
    quotas = _list(kube, source, "computequotas")
    leases, leases_missing = _optional(kube, source, "leases")
    if namespace is None:
        pods_path, pods_verb = "/api/v1/pods", "list pods in all namespaces"
    else:
        pods_path = paths_for("v1", "pods", namespace)
        pods_verb = f"list pods in namespace {namespace}"
    pods, pods_missing = _optional(kube, source, "pods", pods_path, pods_verb)
    view = summarise(nodes, pods or (), quotas, leases, time.time() if now is None else now)
    view.pods_missing = pods_missing
    view.heartbeats_missing = leases_missing
    view.namespace = namespace
    return view
