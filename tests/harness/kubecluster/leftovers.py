"""What a deleted pod may have left on its node, looked for everywhere it could be: hcsd's
ledger and quota directories, the ComputeNode, containerd's running containers and ready
sandboxes, the node's mounts, the pod's cgroups and processes, kubelet's pod and log
directories. (Records of exited containers and stopped sandboxes wait for kubelet's container
GC, up to about a minute: kubelet's bookkeeping, not looked for.)

Pods are named by what the node knows them by: the pod's uid, its main container's id and
its sandbox's id (recorded before the deletion, while containerd still lists it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.harness.kubecluster import hcs
from tests.harness.kubecluster.cluster import KubeletCluster
from tests.harness.kubecluster.node import KubeletNode, cgroup_trees
from tests.harness.leftovers import command, mounts_naming, processes_in


@dataclass(frozen=True)
class Gone:
    """A pod deleted from the API server, by the names its node knew it by."""

    node: str
    name: str
    uid: str
    container: str
    sandbox: str
    at: float  # time.monotonic() of the deletion


def sandbox_of(node: KubeletNode, uid: str) -> str:
    """The id of the pod's sandbox in the node's containerd, asked while it is listed (a pod
    whose sandbox is not found would have its sandbox silently not looked for)."""
    for sandbox in node.containerd.crictl_json("pods")["items"]:
        if sandbox["metadata"]["uid"] == uid:
            return str(sandbox["id"])
    raise AssertionError(f"{node.name}: containerd lists no sandbox of pod {uid}")


def _entries(directory: Path, needles: Iterable[str]) -> list[str]:
    if not directory.is_dir():
        return []
    wanted = [n for n in needles if n]
    return sorted(p.name for p in directory.iterdir() if any(n in p.name for n in wanted))


def leftovers(
    cluster: KubeletCluster, node: KubeletNode, gone: Iterable[Gone]
) -> Mapping[str, list[str]]:
    """Where something of the pods in `gone` that ran on `node` is left (empty: nothing)."""
    ours = [g for g in gone if g.node == node.name]
    uids = {g.uid for g in ours}
    assert all(g.container and g.sandbox for g in ours), ours  # else not looked for
    ids = {g.container for g in ours} | {g.sandbox for g in ours}
    found: dict[str, list[str]] = {}
    assert node.hcsd is not None
    ledger = json.loads(node.hcsd.hcsctl("--json", "allocations").stdout or "[]")
    found["hcsd ledger"] = sorted(a["container_id"] for a in ledger if a["container_id"] in ids)
    found["quota directories"] = _entries(node.host_path(f"{hcs.RUN_DIR}/containers"), ids)
    computenode = cluster.kube.get(f"/apis/hcs.io/v1alpha1/computenodes/{node.name}")
    found["ComputeNode allocations"] = sorted(
        a["pod"]
        for a in (computenode.get("status") or {}).get("allocations") or []
        if a["podUID"] in uids
    )
    # An exited container and a stopped sandbox stay listed (with their snapshot and
    # kubelet's log link) until kubelet's container GC, up to about a minute: kubelet's
    # bookkeeping, with no process or mount. One still running or ready is left behind.
    listed = node.containerd.crictl_json("ps", "--all")["containers"]
    found["running containers"] = sorted(
        c["id"][:12] for c in listed if c["id"] in ids and c["state"] != "CONTAINER_EXITED"
    )
    sandboxes = node.containerd.crictl_json("pods")["items"]
    found["ready sandboxes"] = sorted(
        s["id"][:12]
        for s in sandboxes
        if s["metadata"]["uid"] in uids and s["state"] == "SANDBOX_READY"
    )
    found["mounts"] = mounts_naming(ids | uids, node.namespace.pid)
    theirs = [
        path
        for tree in cgroup_trees(node.cgroup_root)
        for path in tree.rglob("*")
        if path.is_dir() and any(n in path.name for n in ids | {f"pod{u}" for u in uids})
    ]
    found["cgroups"] = sorted(map(str, theirs))
    found["processes in their cgroups"] = [str(pid) for pid in processes_in(theirs)]
    found["processes naming them in the node's namespace (shims)"] = [
        line for line in map(command, node.namespace.processes()) if any(n in line for n in ids)
    ]
    found["kubelet pod directories"] = _entries(node.host_path("/var/lib/kubelet/pods"), uids)
    found["pod log directories"] = _entries(node.dir / "pod-logs", uids)
    return {where: what for where, what in found.items() if what}
