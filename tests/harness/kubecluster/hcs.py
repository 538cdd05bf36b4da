"""Every setting and flag the kubelet cluster gives HCS's own processes, in one place.

hcsd runs on each node with its default paths (the node's mount namespace makes /etc/hcsd,
/run/hcsd, /var/lib/hcsd, /usr/lib/hcs and the NRI socket's directory private), so its file
names only what a test node must differ in. hcs-syncer runs per node in the same namespace and
hcs-scheduler-extender on the host; both as host processes, because the project has no
container image yet (the shipped DaemonSet and Deployment are not applied). When hcsd's
defaults, the key delivery or the extender's transport change, this is the file to adapt.
"""

from __future__ import annotations

import base64
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.controlplane import MANIFESTS, manifests
from tests.harness.daemon import Settings

#: Where the node's hcsd reads its node file (inside the node's /etc/hcsd).
NODE_FILE = "/etc/hcsd/nodes/node.toml"
#: Where the syncer installs the key for hcsd (hcsd's default assignment_key_file).
KEY_FILE = "/etc/hcsd/assignment.key"
#: hcsd's default run directory: per-container quota directories are under containers/.
RUN_DIR = "/run/hcsd"
LEASE_SECONDS = 8
NOT_APPLIED = ("DaemonSet", "Deployment")  # they need HCS's image
NO_IMAGE = (
    "HCS HAS NO CONTAINER IMAGE YET: hcs-syncer and hcs-scheduler-extender run as host "
    "processes; the shipped DaemonSet and Deployment are not applied (see the ecosystem issue)"
)


def hcsd_settings(name: str, metrics_port: int) -> Settings:
    """hcsd's file on a kubelet node: cluster mode, the simulated node, a free metrics port
    (two nodes share the host's network), health watching off (no kernel events to watch)."""
    return {
        "node": {"name": name, "mode": "cluster"},
        "daemon": {"shutdown_grace": 1},
        "metrics": {"listen": f"127.0.0.1:{metrics_port}"},
        "discovery": {"backends": ["simulated"], "simulated_node": NODE_FILE},
        "health": {"source": "off"},
    }


def syncer_command(name: str, kubeconfig: Path, secret: Path) -> list[str]:
    """hcs-syncer for node `name`, as its DaemonSet runs it: the mounted Secret's key
    installed where hcsd reads it; a short Lease so a dead node shows within seconds."""
    return [
        sys.executable, "-m", "hcsd.cluster.syncer_cli", "--node-name", name,
        "--kubeconfig", str(kubeconfig),
        "--lease-seconds", str(LEASE_SECONDS), "--renew-seconds", "2", "--resync-seconds", "30",
        "--install-key", str(secret), "--key-file", KEY_FILE,
    ]  # fmt: skip


@dataclass(frozen=True)
class ExtenderPorts:
    """Where the extender serves kube-scheduler's verbs, and its probes."""

    verbs: int
    probes: int


def extender_command(
    ports: ExtenderPorts, kubeconfig: Path, key_file: Path, certs: Path
) -> list[str]:
    """hcs-scheduler-extender on loopback as the manifests ship it: the verbs over mutual
    TLS (its serving certificate and kube-scheduler's CA from the control plane's `certs`),
    the probes in plain HTTP on a port of their own."""
    return [
        sys.executable, "-m", "hcsd.cluster.extender_cli",
        "--listen", f"127.0.0.1:{ports.verbs}", "--probe-listen", f"127.0.0.1:{ports.probes}",
        "--tls-cert", str(certs / "extender-serving.crt"),
        "--tls-key", str(certs / "extender-serving.key"),
        "--tls-client-ca", str(certs / "ca.crt"),
        "--key-file", str(key_file),
        "--kubeconfig", str(kubeconfig), "--leader-elect", "--identity", "extender-0",
        "--quota-status-seconds", "0.5",
    ]  # fmt: skip


def extender_url(ports: ExtenderPorts) -> str:
    """kube-scheduler's urlPrefix for the extender: https, so it presents its certificate."""
    return f"https://127.0.0.1:{ports.verbs}/"


def extender_ready_url(ports: ExtenderPorts) -> str:
    return f"http://127.0.0.1:{ports.probes}/readyz"


def cluster_objects(key: bytes) -> list[dict[str, Any]]:
    """What is applied of packaging/kubernetes: the kustomization's objects but the
    workloads (they need the image), and the key Secret with `key`."""
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    docs = [
        d
        for d in manifests(*kustomization["resources"])
        if d["kind"] not in NOT_APPLIED and d["kind"] != "Secret"
    ]
    for secret in manifests("secret.yaml"):
        secret.pop("stringData", None)
        secret["data"] = {"assignment.key": base64.b64encode(key).decode()}
        docs.append(secret)
    return docs


def node_key(cluster_key: bytes, node: str) -> bytes:
    """The key an assignment for `node` is signed with: today the cluster's one key."""
    del node
    return cluster_key
