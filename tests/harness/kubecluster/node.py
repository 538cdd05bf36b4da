"""One real Kubernetes node on this host: a mount namespace with its own containerd 2.3 (NRI
on), hcsd in cluster mode with its default paths, hcs-syncer and kubelet 1.36.

What these machines need (docs/testing-kubelet.md, "Running kubelet here"): a cgroup v1 host, so
`failCgroupV1: false` and the cgroupfs driver; a `cgroupRoot` of its own made in every
mounted hierarchy (kubelet refuses one with missing paths) so two kubelets' `kubepods` stay
apart; its own ports and root directory; volume plugins and pod logs redirected away from
the host's /usr/libexec and /var/log; a CNI conflist (the node stays NotReady without one,
even for host-network pods); a node client certificate for the Node authorizer.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from hcsd.contract import paths
from tests.cluster.controlplane import free_port
from tests.harness import cgroups
from tests.harness.daemon import LIBHCS, Daemon, Settings
from tests.harness.kubecluster import hcs
from tests.harness.kubecluster.namespace import Bind, MountNamespace
from tests.harness.kubecluster.vendors import VendorNode
from tests.harness.peers.runtimes import Binaries
from tests.runtime.containerd import Containerd

CNI_CONFLIST = {
    "cniVersion": "1.0.0",
    "name": "hcs-host-network",  # pods here use the host's network: never called
    "plugins": [{"type": "loopback"}],
}


class NodeContainerd(Containerd):
    """containerd started inside the node's mount namespace (it must see kubelet's mounts)."""

    def __init__(self, binaries: Binaries, directory: Path, namespace: MountNamespace) -> None:
        super().__init__(binaries, directory, nri_socket=directory / "nri" / "nri.sock")
        self.namespace = namespace

    def _command(self) -> list[str]:
        return [*self.namespace.enter, *super()._command()]


def _real(path: str) -> str:
    """`path` without the /var/run link (a bind mount needs the real directory)."""
    return "/run" + path.removeprefix("/var/run") if path.startswith("/var/run/") else path


def cgroup_trees(name: str) -> list[Path]:
    """The tree `name` (a kubelet's `cgroupRoot`) in every hierarchy."""
    return [hierarchy / name.strip("/") for hierarchy in cgroups.hierarchies()]


def make_cgroup_root(name: str) -> None:
    """kubelet refuses a `cgroupRoot` missing from any hierarchy ("has some missing paths")."""
    for path in cgroup_trees(name):
        path.mkdir(exist_ok=True)
        if path.parent.name == "cpuset":  # an empty cpuset takes no process
            for key in ("cpuset.cpus", "cpuset.mems"):
                (path / key).write_text((path.parent / key).read_text())


class KubeletNode:
    """Start with `start(...)`; `close()` stops everything and says what it had to clean."""

    def __init__(
        self,
        name: str,
        vendor: VendorNode,
        work: Path,
        *,
        runtime: Binaries,
        kube_bin: Path,
        address: str,
        settings: Settings | None = None,
    ) -> None:
        self.name = name
        self.settings = settings or {}  # hcsd's, over hcs.hcsd_settings (a test's cluster)
        self.kube_bin = kube_bin
        self.address = address  # kubelet cannot serve on loopback
        self.vendor = vendor
        self.dir = work / name
        self.dir.mkdir(parents=True)
        self.cgroup_root = f"/hcs-kubelet-{os.getpid()}-{name}"
        nri_dir = _real(str(Path(paths.NRI_SOCKET).parent))
        self.private = {
            "/etc/hcsd": self.dir / "etc-hcsd",
            paths.RUN_DIR: self.dir / "run-hcsd",
            paths.STATE_DIR: self.dir / "var-lib-hcsd",
            str(Path(paths.LIBHCS).parent): self.dir / "usr-lib-hcs",
            # containerd's NRI socket is in its directory; hcsd finds it at its default.
            nri_dir: self.dir / "containerd" / "nri",
            _real(paths.CDI_DIR): self.dir / "cdi",
            "/var/lib/kubelet": self.dir / "kubelet",
            "/var/log/containers": self.dir / "log-containers",
            vendor.install_dir: self.dir / "driver",
        }
        for source in self.private.values():
            source.mkdir(parents=True, exist_ok=True)
        binds = [Bind(target, source) for target, source in self.private.items()]
        binds += [Bind(node, Path("/dev/null")) for node in vendor.node_devices()]
        self.namespace = MountNamespace(self.dir, binds)
        self.containerd = NodeContainerd(runtime, self.dir / "containerd", self.namespace)
        self.hcsd: Daemon | None = None
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.kubelet_port = free_port()

    def host_path(self, inside: str) -> Path:
        """Where a path of the node's private directories is seen from the host."""
        for target, source in self.private.items():
            if inside == target or inside.startswith(target + "/"):
                return source / os.path.relpath(inside, target)
        raise ValueError(f"{inside} is not private to node {self.name}")

    def start(self, kubeconfig: Path, ca: Path) -> None:
        """containerd, hcsd and kubelet (the syncer comes once the Node is registered)."""
        self._files()
        make_cgroup_root(self.cgroup_root)
        self.namespace.start()
        (self.containerd.dir / "cni" / "net.d").mkdir(parents=True)
        (self.containerd.dir / "cni" / "net.d" / "10-hcs.conflist").write_text(
            json.dumps(CNI_CONFLIST)
        )
        self.containerd.launch()
        self._start_hcsd()
        config = self.dir / "kubelet.yaml"
        config.write_text(yaml.safe_dump(self.kubelet_config(ca)))
        self.spawn("kubelet", [
            str(self.kube_bin / "kubelet"), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--hostname-override={self.name}", f"--node-ip={self.address}", "--v=2",
        ])  # fmt: skip

    def _files(self) -> None:
        """hcsd's node file, libhcs where the package installs it, the driver's files."""
        nodes = self.host_path(hcs.NODE_FILE)
        nodes.parent.mkdir(parents=True, exist_ok=True)
        nodes.write_text(self.vendor.node_file())
        libhcs = self.host_path(paths.LIBHCS)
        libhcs.write_bytes(LIBHCS.read_bytes())
        libhcs.chmod(0o755)
        self.vendor.driver_tree(self.private[self.vendor.install_dir], self.name)

    def _start_hcsd(self) -> None:
        daemon = Daemon(self.dir / "hcsd")
        # Its defaults, which the namespace makes private, and only what a test node needs.
        daemon.settings = {t: dict(k) for t, k in hcs.hcsd_settings(self.name, free_port()).items()}
        daemon.configure(self.settings)
        daemon.socket = str(self.host_path(paths.SOCKET))
        daemon.prefix = self.namespace.enter
        self.hcsd = daemon
        daemon.start()

    def spawn(self, name: str, command: list[str]) -> None:
        log = open(self.dir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.processes[name] = subprocess.Popen(
            [*self.namespace.enter, *command],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kubelet_config(self, ca: Path) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,  # these hosts are cgroup v1 hybrid
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "address": self.address,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "containerRuntimeEndpoint": f"unix://{self.containerd.grpc_socket}",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(ca)},
            },
            "authorization": {"mode": "AlwaysAllow"},  # the API server's client cert only
            "volumePluginDir": str(self.dir / "volume-plugins"),
            "podLogsDirectory": str(self.dir / "pod-logs"),
            "failSwapOn": False,
            "imageGCHighThresholdPercent": 100,  # the imported images cannot be pulled again
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "maxPods": 20,
            "shutdownGracePeriod": "0s",
            "serializeImagePulls": False,
        }  # fmt: skip

    def stop_process(self, name: str, grace: float = 10) -> None:
        process = self.processes.pop(name, None)
        if process is None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def close(self, log: Callable[[str], None]) -> list[str]:
        """Stop the kubelet first (it would restart what containerd stops), the pods with
        containerd, then hcsd and the syncer; what had to be killed or could not be removed."""
        problems: list[str] = []
        self.stop_process("kubelet")
        try:
            self.containerd.close()
        except Exception as e:  # the rest must still be cleaned
            problems.append(f"containerd: {e}")
        self.stop_process("syncer")
        if self.hcsd is not None:
            with contextlib.suppress(Exception):
                self.hcsd.stop()
            self.hcsd.close()
        strays = cgroups.processes(cgroup_trees(self.cgroup_root))
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if strays:
            problems.append(f"processes left in {self.cgroup_root}: {sorted(strays)}")
        killed = self.namespace.close()
        if killed:
            problems.append(f"processes left in the mount namespace: {killed}")
        problems += [
            p for tree in cgroup_trees(self.cgroup_root) for p in cgroups.remove_tree(tree)
        ]
        for problem in problems:
            log(f"kubelet cluster: node {self.name}: {problem}")
        return problems
