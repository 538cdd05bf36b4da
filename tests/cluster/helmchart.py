"""The Helm chart against a real API server: a control plane of its own (helm owns what it
installs, so the shipped objects other fixtures apply must not be there), the real `helm`
(tests/harness/peers/helm.py) and helpers to read back what a release made.

The API server is the release's own build stamped with its version (Helm checks the chart's
`kubeVersion` and derives hcs-scheduler's image from it) and runs with
`--enable-aggregator-routing=true`: with no kube-proxy, it then reaches a webhook's Service
at the Service's endpoints.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from hcsd.cluster.kube import Kube, KubeError
from tests.cluster.controlplane import REPO, ControlPlane, free_port
from tests.harness.peers.helm import ensure_helm
from tests.harness.peers.kubernetes import ensure_apiserver_stamped, find_etcd

CHART = REPO / "packaging" / "helm" / "hcs"
# The chart has no default image (HCS publishes none): the name `make image` builds, which the
# test nodes import from its OCI tarball and never pull.
IMAGE_VALUES = ("--set", "image.repository=docker.io/hcs/hcs-cluster")
NAMESPACE = "hcs-system"
RELEASE = "hcs"

PLURALS = {
    "ServiceAccount": "serviceaccounts", "Secret": "secrets", "ConfigMap": "configmaps",
    "Service": "services", "Namespace": "namespaces", "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings", "Role": "roles", "RoleBinding": "rolebindings",
    "DaemonSet": "daemonsets", "Deployment": "deployments",
    "CustomResourceDefinition": "customresourcedefinitions",
    "NetworkPolicy": "networkpolicies",
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    "PodDisruptionBudget": "poddisruptionbudgets", "ResourceQuota": "resourcequotas",
}  # fmt: skip


def object_path(doc: dict[str, Any]) -> str:
    """The API path of the object `doc` describes."""
    version = doc["apiVersion"]
    base = f"/api/{version}" if "/" not in version else f"/apis/{version}"
    namespace = doc["metadata"].get("namespace")
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{where}/{PLURALS[doc['kind']]}/{doc['metadata']['name']}"


@dataclass
class Helm:
    """`helm` against one control plane, as cluster-admin."""

    binary: Path
    plane: ControlPlane

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        home = self.plane.work / "helm-home"  # its cache and config, not the user's
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(home),  # client-go's discovery cache (~/.kube/cache)
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        done = subprocess.run(
            [str(self.binary), "--kubeconfig", str(self.plane.config_for("admin")), *args],
            capture_output=True, text=True, env=env, check=False, timeout=300,
        )  # fmt: skip
        if check and done.returncode:
            raise AssertionError(f"helm {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
        return done

    def install(self, *values: str) -> None:
        self("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
             *IMAGE_VALUES, *values)  # fmt: skip

    def upgrade(self, *values: str) -> None:
        self("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, *IMAGE_VALUES, *values)

    def uninstall(self) -> None:
        self("uninstall", RELEASE, "--namespace", NAMESPACE)

    def manifest(self) -> list[dict[str, Any]]:
        """The objects of the release's current revision (templates, not CRDs)."""
        text = self("get", "manifest", RELEASE, "--namespace", NAMESPACE).stdout
        return [d for d in yaml.safe_load_all(text) if d]


def present(kube: Kube, docs: list[dict[str, Any]]) -> list[str]:
    """`Kind/name` of each of `docs` that the API server holds."""
    found = []
    for doc in docs:
        try:
            kube.get(object_path(doc))
        except KubeError as e:
            if not e.not_found:
                raise
            continue
        found.append(f"{doc['kind']}/{doc['metadata']['name']}")
    return found


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Helm]:
    binary = ensure_helm()
    if isinstance(binary, str):
        pytest.skip(f"SKIP helm tests: {binary}")
    apiserver = ensure_apiserver_stamped()
    if isinstance(apiserver, str):
        pytest.skip(f"SKIP helm tests: {apiserver}")
    etcd = find_etcd()
    if isinstance(etcd, str):
        pytest.skip(f"SKIP helm tests: {etcd}")
    work = tmp_path_factory.mktemp("helm")
    plane = ControlPlane(
        apiserver, etcd, work, apiserver_args=["--enable-aggregator-routing=true"]
    ).start()
    try:
        yield Helm(binary, plane)
    finally:
        plane.stop()


WEBHOOK = "hcs-admission-webhook"


def host_address() -> str:
    """An IPv4 address of this host other than loopback: Endpoints may not name loopback."""
    words = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False)
    for word in words.stdout.split():
        if "." in word and not word.startswith("127."):
            return word
    pytest.skip("SKIP: this host has no IPv4 address other than loopback, for the webhook")


def webhook_endpoints(kube: Kube, address: str, port: int) -> None:
    """What the endpoints controllers would write for the webhook's Service (none runs)."""
    kube.create(f"/api/v1/namespaces/{NAMESPACE}/endpoints", {
        "apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": WEBHOOK},
        "subsets": [{"addresses": [{"ip": address}],
                     "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
    })  # fmt: skip
    kube.create(f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices", {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": f"{WEBHOOK}-test", "labels": {"kubernetes.io/service-name": WEBHOOK}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    })  # fmt: skip


def secret_files(kube: Kube, name: str, directory: Path) -> Path:
    """The installed Secret `name` as its volume would show it (0440)."""
    secret = kube.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}")
    directory.mkdir(parents=True, exist_ok=True)
    for key, value in secret["data"].items():
        (directory / key).write_bytes(base64.b64decode(value))
        (directory / key).chmod(0o440)
    return directory


def start_webhook(helm: Helm, directory: Path, *extra: str) -> subprocess.Popen[bytes]:
    """hcs-admission-webhook with the release's certificate, behind the release's Service
    (its endpoints name this host), with `extra` flags; registered as plane process
    "webhook"."""
    kube = helm.plane.kube()
    tls = secret_files(kube, "hcs-admission-webhook-tls", directory)
    port = free_port()
    webhook_endpoints(kube, host_address(), port)
    kube.close()
    log = open(directory / "webhook.log", "ab")  # noqa: SIM115 - as long as the process
    process = subprocess.Popen(
        [sys.executable, "-m", "hcsd.cluster.webhook_server", "--listen", f"0.0.0.0:{port}",
         "--tls-cert", str(tls / "tls.crt"), "--tls-key", str(tls / "tls.key"), *extra],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    helm.plane.processes["webhook"] = process
    helm.plane.wait_ready("webhook", f"https://127.0.0.1:{port}/healthz", timeout=30)
    return process
