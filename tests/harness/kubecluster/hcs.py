"""Every setting and flag the kubelet cluster gives HCS's own processes, in one place.

hcsd runs on each node with its default paths (the node's mount namespace makes /etc/hcsd,
/run/hcsd, /var/lib/hcsd, /usr/lib/hcs and the NRI socket's directory private), so its file
names only what a test node must differ in. hcs-syncer runs per node in the same namespace and
hcs-scheduler-extender on the host; both as host processes, because the project has no
container image yet (the shipped DaemonSet and Deployment are not applied). The assignment
keys are made, handed to the extender and the syncers, and read back for verifying here too.
When hcsd's defaults, the key delivery or the extender's transport change, this is the file
to adapt.
"""

from __future__ import annotations

import base64
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.controlplane import MANIFESTS, ControlPlane, manifests
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


Keys = bytes  # the cluster's assignment key, the same on every node


def new_keys() -> Keys:
    return secrets.token_hex(32).encode()


def verifying_keys(keys: Keys, node: str) -> bytes:
    """What `node`'s hcsd verifies its assignments with: the cluster's one key."""
    del node
    return keys


def syncer_command(
    name: str, plane: ControlPlane, keys: Keys, work: Path, ports: ExtenderPorts
) -> list[str]:
    """hcs-syncer for node `name` (whose Node is registered), as its DaemonSet runs it: the
    mounted Secret's key installed where hcsd reads it; a short Lease so that a dead node
    shows within seconds."""
    del ports
    secret = work / "syncer-secret" / "assignment.key"  # the Secret's volume
    if not secret.exists():
        secret.parent.mkdir()
        secret.write_bytes(keys)
        secret.chmod(0o400)  # the DaemonSet's defaultMode
    return [
        sys.executable, "-m", "hcsd.cluster.syncer_cli", "--node-name", name,
        "--kubeconfig", str(plane.config_for("syncer")),
        "--lease-seconds", str(LEASE_SECONDS), "--renew-seconds", "2", "--resync-seconds", "30",
        "--install-key", str(secret), "--key-file", KEY_FILE,
    ]  # fmt: skip


@dataclass(frozen=True)
class ExtenderPorts:
    """Where the extender serves kube-scheduler's verbs, and its probes."""

    verbs: int
    probes: int


def extender_command(
    ports: ExtenderPorts, plane: ControlPlane, keys: Keys, work: Path
) -> list[str]:
    """hcs-scheduler-extender on loopback as the manifests ship it: the verbs over mutual
    TLS (its serving certificate and kube-scheduler's CA from the control plane), the probes
    in plain HTTP on a port of their own, the key as the Secret's volume shows it."""
    key_file = work / "extender-secret" / "assignment.key"
    key_file.parent.mkdir()
    key_file.write_bytes(keys)
    key_file.chmod(0o440)  # as the Secret is mounted for it: the group is the process's own
    return [
        sys.executable, "-m", "hcsd.cluster.extender_cli",
        "--listen", f"127.0.0.1:{ports.verbs}", "--probe-listen", f"127.0.0.1:{ports.probes}",
        *plane.extender_tls(), "--key-file", str(key_file),
        "--kubeconfig", str(plane.config_for("extender")), "--leader-elect",
        "--identity", "extender-0", "--quota-status-seconds", "0.5",
    ]  # fmt: skip


def extender_url(ports: ExtenderPorts) -> str:
    """kube-scheduler's urlPrefix for the extender: https, so it presents its certificate."""
    return f"https://127.0.0.1:{ports.verbs}/"


def extender_ready_url(ports: ExtenderPorts) -> str:
    return f"http://127.0.0.1:{ports.probes}/readyz"


def cluster_objects(keys: Keys) -> list[dict[str, Any]]:
    """What is applied of packaging/kubernetes: the kustomization's objects but the
    workloads (they need the image), and the key Secret with `keys`."""
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    docs = [
        d
        for d in manifests(*kustomization["resources"])
        if d["kind"] not in NOT_APPLIED and d["kind"] != "Secret"
    ]
    for secret in manifests("secret.yaml"):
        secret.pop("stringData", None)
        secret["data"] = {"assignment.key": base64.b64encode(keys).decode()}
        docs.append(secret)
    return docs
