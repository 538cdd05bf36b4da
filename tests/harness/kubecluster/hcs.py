"""Every setting and flag the kubelet cluster gives HCS's own processes, in one place.

hcsd runs on each node with its default paths (the node's mount namespace makes /etc/hcsd,
/run/hcsd, /var/lib/hcsd, /usr/lib/hcs and the NRI socket's directory private), so its file
names only what a test node must differ in. hcs-syncer runs per node in the same namespace and
hcs-scheduler-extender on the host; both as host processes (the shipped DaemonSet and
Deployment are not applied here; a bare cluster runs them from the image, see cluster.py).
The assignment keys are made, handed to the extender and the syncers, and read back for
verifying here too. When hcsd's defaults, the key delivery or the extender's transport
change, this is the file to adapt.
"""

from __future__ import annotations

import base64
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hcsd.cluster.kube import Kube, KubeError
from hcsd.contract.keyring import Keyring, derive
from tests.cluster.controlplane import (
    MANIFESTS,
    ControlPlane,
    free_port,
    manifests,
    request_token,
    token_kubeconfig,
)
from tests.harness.daemon import Settings
from tests.runtime.image import BUSYBOX_IMAGE

#: Where the node's hcsd reads its node file (inside the node's /etc/hcsd).
NODE_FILE = "/etc/hcsd/nodes/node.toml"
#: hcsd's default run directory: per-container quota directories are under containers/.
RUN_DIR = "/run/hcsd"
LEASE_SECONDS = 8
NOT_APPLIED = ("DaemonSet", "Deployment")  # they need HCS's image
HOST_PROCESSES = (
    "hcs-syncer and hcs-scheduler-extender run as host processes; the shipped DaemonSet and "
    "Deployment are not applied (tests/kubelet/test_image_pods.py runs the syncers from HCS's "
    "image on a bare cluster)"
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


Keys = Keyring  # the cluster's assignment keys; each node verifies with keys derived for it


def new_keys() -> Keys:
    return Keyring({"k1": secrets.token_hex(32).encode()}, "k1")


def verifying_keys(keys: Keys, node: str) -> dict[str, bytes]:
    """What `node`'s hcsd verifies its assignments with: the keys derived for it."""
    return dict(derive(keys, node).keys)


def syncer_pod(kube: Kube, node: str) -> dict[str, Any]:
    """The syncer DaemonSet's pod on `node`, which its tokens are bound to (so they name the
    node, as admission-syncer.yaml wants). Without HCS's image it is a placeholder, busybox
    sleeping; kubelet runs it like any pod."""
    name = f"hcs-syncer-{node}"
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "hcs-system"},
        "spec": {
            "nodeName": node, "serviceAccountName": "hcs-syncer", "hostNetwork": True,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "syncer", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 86400 & wait"],
            }],
        },
    }  # fmt: skip
    try:
        return kube.create("/api/v1/namespaces/hcs-system/pods", pod)
    except KubeError as e:
        if not e.conflict:
            raise
        return kube.get(f"/api/v1/namespaces/hcs-system/pods/{name}")


def syncer_command(
    name: str, plane: ControlPlane, keys: Keys, work: Path, ports: ExtenderPorts
) -> list[str]:
    """hcs-syncer for node `name` (whose Node is registered), as its DaemonSet runs it: its
    pod's token for the API, a projected token of audience hcs-node-keys to fetch its node's
    keys from the extender, which it installs in hcsd; a short Lease so that a dead node shows
    within seconds."""
    del keys
    certs = work / "certs"
    admin = plane.kube()
    try:
        pod = syncer_pod(admin, name)
        api_token = request_token(admin, "hcs-syncer", pod=pod)
        keys_token = request_token(admin, "hcs-syncer", pod=pod, audience="hcs-node-keys")
    finally:
        admin.close()
    kubeconfig = token_kubeconfig(
        work / f"syncer-{name}.kubeconfig", plane.server, certs, api_token
    )
    token = work / f"syncer-{name}.token"
    token.write_text(keys_token)
    token.chmod(0o600)
    return [
        sys.executable, "-m", "hcsd.cluster.syncer_cli", "--node-name", name,
        "--kubeconfig", str(kubeconfig),
        "--lease-seconds", str(LEASE_SECONDS), "--renew-seconds", "2", "--resync-seconds", "30",
        "--node-keys-url", f"https://127.0.0.1:{ports.node_keys}/node-keys",
        "--node-keys-ca", str(certs / "ca.crt"), "--token-file", str(token),
        "--keys-seconds", "2",
        "--kubelet-plugin",  # DRA: kubelet's plugin for compute.hcs.io (tests/kubelet/test_dra.py)
    ]  # fmt: skip


@dataclass(frozen=True)
class ExtenderPorts:
    """Where the extender serves kube-scheduler's verbs, its probes, and each node's keys."""

    verbs: int
    probes: int
    node_keys: int = field(default_factory=free_port)


def extender_command(
    ports: ExtenderPorts, plane: ControlPlane, keys: Keys, work: Path
) -> list[str]:
    """hcs-scheduler-extender on loopback as the manifests ship it: the verbs over mutual
    TLS (its serving certificate and kube-scheduler's CA from the control plane), the probes
    in plain HTTP on a port of their own, the keys as the Secret's volume shows them, and
    each node's derived keys served to its syncer over TLS."""
    secret = work / "extender-secret"
    secret.mkdir()
    for kid, key in keys.keys.items():
        (secret / f"{kid}.key").write_bytes(key)
    (secret / "signing").write_text(keys.signing)
    for path in secret.iterdir():
        path.chmod(0o440)  # as the Secret is mounted for it: the group is the process's own
    certs = work / "certs"
    return [
        sys.executable, "-m", "hcsd.cluster.extender_cli",
        "--listen", f"127.0.0.1:{ports.verbs}", "--probe-listen", f"127.0.0.1:{ports.probes}",
        *plane.extender_tls(), "--keys-dir", str(secret),
        "--node-keys-listen", f"127.0.0.1:{ports.node_keys}",
        "--node-keys-cert", str(certs / "extender-serving.crt"),
        "--node-keys-key", str(certs / "extender-serving.key"),
        "--kubeconfig", str(plane.config_for("extender")), "--leader-elect",
        "--identity", "extender-0", "--quota-status-seconds", "0.5",
    ]  # fmt: skip


def controller_command(plane: ControlPlane, probes: int, flags: list[str]) -> list[str]:
    """hcs-controller on the host as its Deployment runs it: as its service account (the
    plane's client certificate of that name, so the shipped RBAC and the admission policies
    of admission-controller.yaml hold it), leader-elected on its Lease (a short one: a
    restart with the same identity takes it over at once), its probes on loopback. `flags`:
    the policy and the timings of the test (healer_cli's flags)."""
    return [
        sys.executable, "-m", "hcsd.cluster.healer_cli",
        "--kubeconfig", str(plane.config_for("controller")), "--identity", "controller-0",
        "--probe-listen", f"127.0.0.1:{probes}", "--lease-seconds", "4", "--renew-seconds", "1",
        *flags,
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
        secret["data"] = {
            **{f"{kid}.key": base64.b64encode(key).decode() for kid, key in keys.keys.items()},
            "signing": base64.b64encode(keys.signing.encode()).decode(),
        }
        docs.append(secret)
    return docs
