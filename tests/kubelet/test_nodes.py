"""The two kubelet nodes share the host but not the paths they would fight over: each sees
its own hcsd files, kubelet directories, driver files and device nodes at the default paths,
none of which is the host's (tests/harness/kubecluster/namespace.py)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from hcsd.contract import paths
from tests.harness.kubecluster.cluster import SYSCTLS, KubeletCluster
from tests.harness.kubecluster.node import KubeletNode
from tests.harness.peers.building import GO_CACHE
from tests.harness.peers.kubernetes import KUBERNETES_VERSION

pytestmark = pytest.mark.slow


def identity_inside(node: KubeletNode, path: str) -> str:
    """`device:inode` of `path` as the node's processes see it."""
    shown = subprocess.run(
        [*node.namespace.enter, "stat", "-L", "-c", "%d:%i", path],
        capture_output=True,
        text=True,
        check=True,
    )
    return shown.stdout.strip()


def identity_on_host(path: str) -> str:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return "missing"
    return f"{found.st_dev}:{found.st_ino}"


def test_each_node_has_its_own_files_at_the_default_paths(
    kubelet_cluster: KubeletCluster,
) -> None:
    shared = [
        paths.SOCKET,
        paths.LIBHCS,
        "/etc/hcsd/nodes/node.toml",
        "/var/lib/kubelet/device-plugins/kubelet.sock",
    ]
    seen: dict[str, set[str]] = {}
    for node in kubelet_cluster.nodes.values():
        for path in [*shared, f"{node.vendor.install_dir}/{node.vendor.library}"]:
            inside = identity_inside(node, path)
            assert inside != identity_on_host(path), f"{node.name} sees the host's {path}"
            assert inside == identity_on_host(str(node.host_path(path))), path
            seen.setdefault(path, set()).add(inside)
        for device in node.vendor.all_device_nodes():  # /dev/null's, at the vendor's path
            assert identity_inside(node, device) == identity_on_host("/dev/null")
    assert all(len(seen[path]) == 2 for path in shared), seen  # and not each other's


def test_every_kernel_setting_kubelet_changes_is_restored() -> None:
    """kubelet sets kernel tunables at its start (`setupKernelTunables`); the cluster saves
    and restores each of them, read from the kubelet source it builds."""
    modules = GO_CACHE / "pkg" / "mod" / "k8s.io"
    manager = modules / f"kubernetes@{KUBERNETES_VERSION}/pkg/kubelet/cm/container_manager_linux.go"
    helpers = modules / f"component-helpers@{KUBERNETES_VERSION.replace('v1.', 'v0.')}"
    names = helpers / "node/util/sysctl/sysctl.go"
    if not manager.exists() or not names.exists():
        pytest.skip(f"the kubelet source is not in the module cache ({manager}, {names})")
    tunables = manager.read_text().split("func setupKernelTunables", 1)[1].split("\n}\n", 1)[0]
    constants = dict(re.findall(r'^\s*(\w+)\s*=\s*"([\w/]+)"', names.read_text(), re.M))
    changed = {constants[name] for name in re.findall(r"utilsysctl\.(\w+):", tunables)}
    assert len(changed) >= 6 and changed <= set(constants.values()), changed
    assert set(SYSCTLS) == changed
