"""A two-node Kubernetes cluster with real kubelets on this host, HCS deployed on it.

The control plane of tests/cluster (etcd, kube-apiserver, kube-scheduler calling HCS's
extender) plus kube-controller-manager, and two nodes (node.py) of different vendors
(vendors.py), each with containerd, hcsd, hcs-syncer and kubelet. HCS's cluster side comes
from the project's manifests (hcs.cluster_objects: the kustomization's objects and the key
Secret); the syncers and the extender run as host processes (hcs.HOST_PROCESSES says so).

`bare=True` starts the control plane, kube-controller-manager and the nodes with their hcsd
(what the packages install on a node) but none of HCS's cluster side: no objects, no
extender, no syncers, kube-scheduler without the extender. A test deploys HCS itself, from
its image (`import_image`, docs/images.md) as pods: they reach the API server with
`api_env()` on the host network, as there is no kube-proxy and no DNS here.

kubelet rewrites three kernel settings on the host (vm.overcommit_memory, kernel.panic,
kernel.panic_on_oops): they are saved before and restored after.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from hcsd.cluster.kube import Kube
from tests.cluster.controlplane import CLIENTS, CONTROLLER_MANAGER, ControlPlane, free_port
from tests.harness import cgroups
from tests.harness.daemon import Settings
from tests.harness.kubecluster import hcs
from tests.harness.kubecluster.node import KubeletNode
from tests.harness.kubecluster.vendors import ASCEND, NVIDIA, VendorNode, build_fakes
from tests.harness.peers.building import Log, say
from tests.harness.peers.kubernetes import (
    ensure_apiserver_stamped,
    ensure_kubernetes,
    ensure_kubernetes_node,
    find_etcd,
)
from tests.harness.peers.runtimes import Binaries, ensure_binaries
from tests.harness.waiting import wait_for
from tests.runtime.image import ImageError, ensure_busybox_image, ensure_pause_image

#: The nodes: a simulated NVIDIA node and a simulated Ascend node.
NODES: dict[str, VendorNode] = {"kube-gpu": NVIDIA, "kube-npu": ASCEND}
#: The kernel settings kubelet changes at its start (`setupKernelTunables`), restored at close.
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


def host_address() -> str | None:
    """The host's first global IPv4 address (kubelet refuses to serve on loopback)."""
    shown = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in shown.stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    return None


@dataclass(frozen=True)
class Peers:
    """What the cluster runs: found or built, or the first reason it cannot run here."""

    control: Path
    node: Path
    etcd: Path
    runtime: Binaries
    address: str


def find_peers(log: Log = say) -> Peers | str:
    """Every prerequisite, checked in order of cost; a string says which is missing."""
    if os.geteuid() != 0:
        return "the kubelet cluster needs root (mount namespaces, cgroups, containerd)"
    for tool in ("unshare", "nsenter", "openssl", "curl", "ip", "make"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not any(h.name == "memory" for h in cgroups.hierarchies()):
        return (
            "no cgroup v1 memory hierarchy under /sys/fs/cgroup (kubelet's cgroupfs driver); "
            "this suite runs on cgroup v1 or hybrid hosts only"
        )
    address = host_address()
    if address is None:
        return "this host has no global IPv4 address for kubelet's --node-ip"
    etcd = find_etcd()
    if isinstance(etcd, str):
        return etcd
    try:
        ensure_busybox_image()
        ensure_pause_image()
    except ImageError as e:
        return f"the test images cannot be built: {e}"
    why = build_fakes()
    if why is not None:
        return why
    runtime = ensure_binaries(log)
    if isinstance(runtime, str):
        return runtime
    control = ensure_kubernetes(log)
    if isinstance(control, str):
        return control
    node = ensure_kubernetes_node(log)
    if isinstance(node, str):
        return node
    return Peers(control, node, etcd, runtime, address)


def with_stamped_apiserver(peers: Peers, work: Path, log: Log = say) -> Peers | str:
    """`peers` with the kube-apiserver that reports the release as its version (for `helm
    install`: the chart's kubeVersion, hcs-scheduler's image tag), the rest as they were."""
    stamped = ensure_apiserver_stamped(log)
    if isinstance(stamped, str):
        return stamped
    control = work / "control-bin"
    control.mkdir(parents=True, exist_ok=True)
    (control / "kube-apiserver").symlink_to(stamped / "kube-apiserver")
    for binary in peers.control.iterdir():
        if not (control / binary.name).exists():
            (control / binary.name).symlink_to(binary)
    return replace(peers, control=control)


def _clients(nodes: dict[str, VendorNode]) -> dict[str, tuple[str, str]]:
    clients = CLIENTS | CONTROLLER_MANAGER
    clients["kubelet-client"] = ("kube-apiserver-kubelet-client", "system:masters")
    for name in nodes:
        clients[f"node-{name}"] = (f"system:node:{name}", "system:nodes")
    return clients


@dataclass
class KubeletCluster:
    """`start()` it; `close()` stops everything and removes what it made."""

    peers: Peers
    work: Path
    log: Log = say
    bare: bool = False  # no HCS cluster side: a test deploys it (module docstring)
    vendors: dict[str, VendorNode] = field(default_factory=lambda: dict(NODES))
    keys: hcs.Keys = field(default_factory=hcs.new_keys)
    nodes: dict[str, KubeletNode] = field(default_factory=dict)
    sysctls: dict[str, str] = field(default_factory=dict)
    plane: ControlPlane | None = None
    admin: Kube | None = None
    timings: dict[str, float] = field(default_factory=dict)
    extender: hcs.ExtenderPorts = field(default_factory=lambda: hcs.ExtenderPorts(0, 0))
    # hcsd's settings per node, over hcs.hcsd_settings (health watching, a fake sysfs)
    hcsd_settings: dict[str, Settings] = field(default_factory=dict)
    controller_probes: int = 0  # hcs-controller's probe port while it runs (start_controller)

    @property
    def kube(self) -> Kube:
        assert self.admin is not None
        return self.admin

    @property
    def control(self) -> ControlPlane:
        assert self.plane is not None
        return self.plane

    def start(self) -> KubeletCluster:
        started = time.monotonic()
        self.sysctls = {name: Path("/proc/sys", name).read_text() for name in SYSCTLS}
        certs = self.work / "certs"
        self.plane = ControlPlane(
            self.peers.control,
            self.peers.etcd,
            self.work,
            clients=_clients(self.vendors),
            # Pods get their service account's projected token (the ServiceAccount admission
            # plugin, which the plane alone turns off: here kube-controller-manager makes the
            # accounts); webhooks behind a Service are called at their endpoints' addresses
            # (no kube-proxy here).
            disabled_admission=("TaintNodesByCondition",),
            apiserver_args=[
                "--enable-aggregator-routing=true",
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={certs / 'kubelet-client.crt'}",
                f"--kubelet-client-key={certs / 'kubelet-client.key'}",
            ],
        )
        self.plane.start()  # after the assignment: close() stops what a failed start began
        self.admin = self.plane.kube()
        if not self.bare:
            self._deploy_hcs()
        self.plane.start_controller_manager(self.peers.node / "kube-controller-manager")
        if self.bare:
            self.plane.start_scheduler(None)
        else:
            self.start_extender()
            self.log(f"kubelet cluster: {hcs.HOST_PROCESSES}")
            self.plane.start_scheduler(hcs.extender_url(self.extender))
        self.timings["control plane"] = time.monotonic() - started
        for name, vendor in self.vendors.items():
            node = KubeletNode(
                name,
                vendor,
                self.work,
                runtime=self.peers.runtime,
                kube_bin=self.peers.node,
                address=self.peers.address,
                settings=self.hcsd_settings.get(name),
            )
            self.nodes[name] = node
            node.start(self.plane.config_for(f"node-{name}"), certs / "ca.crt")
        wait_for(self._nodes_ready, "both kubelets' Nodes are Ready", timeout=90)
        if self.bare:
            self.timings["total"] = time.monotonic() - started
            return self
        for name, node in self.nodes.items():  # a syncer's identity may name its Node
            node.spawn(
                "syncer", hcs.syncer_command(name, self.plane, self.keys, self.work, self.extender)
            )
        wait_for(
            self._compute_nodes_ready,
            "both ComputeNodes are Ready and hold the signing key",
            timeout=60,
        )
        self.timings["total"] = time.monotonic() - started
        return self

    def _deploy_hcs(self) -> None:
        self.control.apply(hcs.cluster_objects(self.keys))

    def start_extender(self) -> None:
        """hcs-scheduler-extender as a host process on loopback (hcs.extender_command)."""
        self.extender = hcs.ExtenderPorts(free_port(), free_port())
        command = hcs.extender_command(self.extender, self.control, self.keys, self.work)
        self.control._spawn("extender", command)
        self.control.wait_ready("extender", hcs.extender_ready_url(self.extender), 60)

    def start_controller(self, flags: list[str]) -> None:
        """hcs-controller as a host process (hcs.controller_command) with `flags`, once its
        caches are synced; a running one is stopped first (its Lease goes to the new one)."""
        self.stop_controller()
        self.controller_probes = free_port()
        command = hcs.controller_command(self.control, self.controller_probes, flags)
        self.control._spawn("controller", command)
        self.control.wait_ready(
            "controller", f"http://127.0.0.1:{self.controller_probes}/readyz", 60
        )

    def stop_controller(self) -> None:
        self.control.stop_process("controller")
        self.controller_probes = 0

    def _nodes_ready(self) -> bool:
        for name in self.nodes:
            for daemon, process in self.nodes[name].processes.items():
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{daemon} of node {name} exited {process.returncode}:\n"
                        + tail(self.nodes[name].dir / f"{daemon}.log")
                    )
        items = self.kube.get("/api/v1/nodes").get("items", [])
        ready = {
            n["metadata"]["name"]
            for n in items
            for c in n.get("status", {}).get("conditions", [])
            if c["type"] == "Ready" and c["status"] == "True"
        }
        return ready >= set(self.nodes)

    def _compute_nodes_ready(self) -> bool:
        """Every node Ready and holding the signing key: until its syncer has fetched the keys
        the extender filters the node out, and kube-scheduler would retry a pod created in that
        window only minutes later."""
        items = self.kube.get("/apis/hcs.io/v1alpha1/computenodes").get("items", [])
        status = {i["metadata"]["name"]: i.get("status") or {} for i in items}
        return all(
            status.get(name, {}).get("phase") == "Ready"
            and self.keys.signing in status.get(name, {}).get("assignmentKeys", [])
            for name in self.nodes
        )

    def import_image(self, tarball: Path) -> None:
        """An OCI layout tarball into every node's containerd (namespace k8s.io), as an
        operator would `ctr -n k8s.io images import` it on each node: nothing is pulled."""
        for node in self.nodes.values():
            node.containerd.import_image(tarball)

    def api_env(self) -> dict[str, str]:
        """What a host-network pod needs to reach the API server here: no kube-proxy carries
        the `kubernetes` Service's address and no DNS names it, so the in-cluster
        configuration is pointed at the API server's own loopback address and port (its
        serving certificate names 127.0.0.1)."""
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(self.control.api_port)}  # fmt: skip

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        """kubectl as cluster-admin; its stdout (and stderr when `check` is off)."""
        done = subprocess.run(
            [str(self.peers.node / "kubectl"), f"--kubeconfig={self.control.config_for('admin')}",
             *args],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done.stdout if check else done.stdout + done.stderr

    def close(self) -> list[str]:
        """Stop the nodes, then the cluster's processes; restore the kernel settings.
        What could not be cleaned (also logged)."""
        problems: list[str] = []
        if self.plane is not None:  # first: it would act on the nodes going away
            self.plane.stop_process("controller")
        for node in self.nodes.values():
            problems += node.close(self.log)
        if self.admin is not None:
            with contextlib.suppress(Exception):
                self.admin.close()
        if self.plane is not None:
            self.plane.stop_process("extender")
            self.plane.stop()
        for name, value in self.sysctls.items():
            Path("/proc/sys", name).write_text(value)
        return problems


def tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return f"(no {path})"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def started(
    peers: Peers,
    work: Path,
    log: Log = say,
    *,
    bare: bool = False,
    vendors: dict[str, VendorNode] | None = None,
    hcsd_settings: dict[str, Settings] | None = None,
) -> KubeletCluster:
    """A started cluster; on a failure to start, everything already started is stopped."""
    cluster = KubeletCluster(
        peers, work, log, bare=bare, vendors=dict(vendors or NODES),
        hcsd_settings=dict(hcsd_settings or {}),
    )  # fmt: skip
    try:
        return cluster.start()
    except BaseException:
        cluster.close()
        raise
