"""`helm install`, `helm upgrade` and `helm uninstall` of packaging/helm/hcs with the real
helm against the real API server (which validates every object; no kubelet runs the pods).

Install makes every object and the Secrets (keys and certificates that work together: a TLS
handshake with them, checked as the extender and kube-scheduler check); upgrade with other
values changes what they say and leaves the Secrets byte for byte; uninstall leaves the CRDs
(Helm never deletes crds/) and, with keepSecrets, the assignment keys, which the next install
takes over unchanged.
"""

from __future__ import annotations

import base64
import re
import socket
import ssl
import threading
from pathlib import Path

import pytest

from hcsd.cluster.kube import Kube
from hcsd.cluster.tls import peer_of, server_context
from hcsd.contract import assignment
from tests.cluster.helmchart import CHART, IMAGE_VALUES, NAMESPACE, Helm, helm, present

__all__ = ["helm"]  # the fixture

pytestmark = pytest.mark.slow

GENERATED = {  # what the chart makes and must keep: (kind, name)
    ("Secret", "hcs-assignment-key"),
    ("Secret", "hcs-scheduler-extender-tls"),
    ("Secret", "hcs-scheduler-client-tls"),
    ("ConfigMap", "hcs-node-keys-ca"),
}
CRDS = ["computenodes.hcs.io", "computequotas.hcs.io"]


def generated(kube: Kube) -> dict[tuple[str, str], dict[str, str]]:
    """The data of the generated objects as the API server holds them."""
    found = {}
    for kind, name in GENERATED:
        plural = "secrets" if kind == "Secret" else "configmaps"
        found[kind, name] = kube.get(f"/api/v1/namespaces/{NAMESPACE}/{plural}/{name}")["data"]
    return found


def files(directory: Path, data: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in data.items():
        (directory / name).write_bytes(base64.b64decode(value))
    return directory


def handshake(server: Path, client: Path, host: str) -> str:
    """A mutual-TLS handshake between the extender's files and hcs-scheduler's, the client
    checking the server's name as kube-scheduler does; the client's CN as the extender
    reads it."""
    context = server_context(
        str(server / "tls.crt"), str(server / "tls.key"), str(server / "client-ca.crt")
    )
    client_context = ssl.create_default_context(cafile=str(client / "ca.crt"))
    client_context.load_cert_chain(str(client / "tls.crt"), str(client / "tls.key"))
    left, right = socket.socketpair()
    seen: list[str] = []

    def serve() -> None:
        with context.wrap_socket(left, server_side=True) as secured:
            peer = peer_of(secured)
            seen.append(peer.common_name if peer else "")
            secured.recv(1)

    thread = threading.Thread(target=serve)
    thread.start()
    with client_context.wrap_socket(right, server_hostname=host) as secured:
        secured.sendall(b"x")
    thread.join(10)
    return seen[0]


def test_install_upgrade_uninstall(helm: Helm, tmp_path: Path) -> None:
    kube = helm.plane.kube()
    helm.install()
    installed = helm.manifest()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in installed}
    for wanted in [
        ("DaemonSet", "hcs-syncer"),
        ("Deployment", "hcs-scheduler-extender"),
        ("Deployment", "hcs-scheduler"),
        ("Deployment", "hcs-admission-webhook"),
        ("ConfigMap", "hcs-scheduler-config"),
        ("MutatingWebhookConfiguration", "hcs-scheduler-name"),
        ("ValidatingAdmissionPolicy", "hcs-syncer-own-node"),
        ("ValidatingAdmissionPolicy", "hcs-assignment-annotation"),
        *GENERATED,
    ]:
        assert wanted in kinds, wanted
    assert len(present(kube, installed)) == len(installed)
    for crd in CRDS:
        kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")

    # The generated Secrets: a 32-byte key with a random id that signs, certificates that work.
    made = generated(kube)
    keys = made["Secret", "hcs-assignment-key"]
    kid = base64.b64decode(keys["signing"]).decode()
    assert re.fullmatch(r"k-[0-9a-f]{8}", kid) and assignment.KID.fullmatch(kid)
    assert sorted(keys) == [f"{kid}.key", "signing"]
    assert len(base64.b64decode(base64.b64decode(keys[f"{kid}.key"]))) == 32
    server = files(tmp_path / "server", made["Secret", "hcs-scheduler-extender-tls"])
    client = files(tmp_path / "client", made["Secret", "hcs-scheduler-client-tls"])
    bundle = made["ConfigMap", "hcs-node-keys-ca"]["ca.crt"]
    assert (
        bundle.encode()
        == (client / "ca.crt").read_bytes()
        == (server / "client-ca.crt").read_bytes()
    )
    host = f"hcs-scheduler-extender.{NAMESPACE}.svc"
    assert handshake(server, client, host) == "hcs-scheduler"
    extender = kube.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/hcs-scheduler-extender")
    command = extender["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--allowed-client") + 1] == "hcs-scheduler"
    assert command[command.index("--scheduler-name") + 1] == "hcs-scheduler"
    scheduler = kube.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/hcs-scheduler")
    (container,) = scheduler["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.k8s.io/kube-scheduler:v1.36.3"  # the cluster's

    # Upgrade with other values: they apply; the Secrets stay byte for byte.
    helm.upgrade("--set", "extender.resources.requests.cpu=300m", "--set", "webhook.enabled=false",
                 "--set", "scheduler.image.tag=v1.36.2")  # fmt: skip
    assert generated(kube) == made
    extender = kube.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/hcs-scheduler-extender")
    (container,) = extender["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"]["cpu"] == "300m"
    webhook = [
        d
        for d in installed
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "hcs-admission-webhook"
    ]
    assert (
        len(webhook) == 6 and present(kube, webhook) == []
    )  # Secret, SA, Deployment, PodDisruptionBudget, Service, config
    helm.upgrade("--reuse-values", "--set", "webhook.enabled=true")
    assert generated(kube) == made

    # The kept client certificate was made for CN hcs-scheduler: another name is refused
    # (the extender would refuse the old certificate), and nothing changes.
    done = helm("upgrade", "hcs", str(CHART), "--namespace", NAMESPACE, "--reuse-values",
                "--set", "extender.tls.clientCommonName=other", check=False)  # fmt: skip
    assert done.returncode != 0
    assert 'clientCommonName is "other" but the kept client certificate' in done.stderr
    assert generated(kube) == made

    # A key rotation's first step done with kubectl (docs/cluster.md) outlives an upgrade.
    key_path = f"/api/v1/namespaces/{NAMESPACE}/secrets/hcs-assignment-key"
    new_key = base64.b64encode(base64.b64encode(b"k" * 32)).decode()
    kube.patch(key_path, {"data": {"k2.key": new_key}})
    rotated = generated(kube)
    assert rotated["Secret", "hcs-assignment-key"] == {**keys, "k2.key": new_key}
    helm.upgrade("--reuse-values")
    assert generated(kube) == rotated

    # Uninstall: only the CRDs are left (keepSecrets is off by default).
    helm.uninstall()
    assert present(kube, installed) == []
    for crd in CRDS:
        kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")

    # keepSecrets: the keys outlive the release, and the next install signs with them.
    helm.install("--set", "keepSecrets=true")
    kept = generated(kube)["Secret", "hcs-assignment-key"]
    assert kept != keys  # a new install without a kept Secret made new keys
    helm.uninstall()
    left = present(kube, installed)
    assert left == ["Secret/hcs-assignment-key"]
    helm.install()
    assert generated(kube)["Secret", "hcs-assignment-key"] == kept
    helm.uninstall()
    assert present(kube, installed) == []
    kube.close()


def test_refused_values(helm: Helm) -> None:
    """Values that cannot work are refused with the reason before anything is installed."""
    done = helm("install", "hcs-dra", str(CHART), "--namespace", NAMESPACE, *IMAGE_VALUES,
                "--set", "mode=dra", "--set", "dra.deviceTaintEffect=PreferNoSchedule",
                check=False)  # fmt: skip
    assert done.returncode != 0
    assert "dra.deviceTaintEffect must be NoSchedule or NoExecute" in done.stderr
    done = helm("install", "hcs-dra", str(CHART), "--namespace", NAMESPACE, *IMAGE_VALUES,
                "--set", "mode=device-plugin", check=False)  # fmt: skip
    assert done.returncode != 0
    assert 'mode: "device-plugin" is not a mode (extender or dra)' in done.stderr
    assert "hcs-dra" not in helm("list", "--all-namespaces").stdout
