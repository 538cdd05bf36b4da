"""The Helm chart against a real API server: a control plane of its own (helm owns what it
installs, so the shipped objects other fixtures apply must not be there), the real `helm`
(tests/harness/peers/helm.py) and helpers to read back what a release made.

The API server is the release's own build stamped with its version (Helm checks the chart's
`kubeVersion` and derives hcs-scheduler's image from it) and runs with
`--enable-aggregator-routing=true`: with no kube-proxy, it then reaches a webhook's Service
at the Service's endpoints.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from hcsd.cluster.kube import Kube, KubeError
from tests.cluster.controlplane import REPO, ControlPlane
from tests.harness.peers.helm import ensure_helm
from tests.harness.peers.kubernetes import ensure_apiserver_stamped, find_etcd

CHART = REPO / "packaging" / "helm" / "hcs"
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
             *values)  # fmt: skip

    def upgrade(self, *values: str) -> None:
        self("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, *values)

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
