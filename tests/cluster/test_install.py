"""The documented install against the real API server: the operator creates the key Secret,
then `kubectl apply -k packaging/kubernetes`; the key must survive that apply (and the next).

With a `kubectl` (built with the Kubernetes peers, or on PATH) the real `apply -k` runs.
Without one, each file the kustomization lists is applied as `kubectl apply` treats an object
that exists: the fields the manifest sets replace the server's (a Secret's `stringData`
replaces its `data`). Said in the test's output, so a run without kubectl is not mistaken for
one with it.
"""

from __future__ import annotations

import base64
import copy
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hcsd.cluster.kube import Kube, KubeError
from hcsd.contract.names import KEY_SECRET, NAMESPACE
from tests.cluster.conftest import kustomized
from tests.cluster.controlplane import MANIFESTS, ControlPlane, _collection_path, manifests
from tests.harness.peers.kubernetes import ensure_kubernetes_node

pytestmark = pytest.mark.slow

SECRET_PATH = f"/api/v1/namespaces/{NAMESPACE}/secrets/{KEY_SECRET}"


def find_kubectl(plane: ControlPlane) -> str | None:
    """The kubectl built at the control plane's release (the kubelet cluster's peers), else
    one on PATH; the release's own is preferred so a distribution's older client (whose
    kustomize may differ) does not decide the test."""
    node = ensure_kubernetes_node()
    if isinstance(node, Path) and (node / "kubectl").exists():
        return str(node / "kubectl")
    print(f"no kubectl built at the control plane's release ({node}); trying PATH")
    return shutil.which("kubectl")


def apply_like_kubectl(kube: Kube, doc: dict[str, Any]) -> None:
    """Create, or overwrite what the manifest sets on the existing object."""
    path = _collection_path(doc)
    try:
        kube.create(path, doc)
        return
    except KubeError as e:
        if not e.conflict:
            raise
    current = kube.get(f"{path}/{doc['metadata']['name']}")
    merged = copy.deepcopy(current)
    for field, value in doc.items():
        if field == "metadata":
            continue
        if field == "stringData":  # the API server folds stringData into data
            merged.setdefault("data", {}).update(
                {k: base64.b64encode(str(v).encode()).decode() for k, v in value.items()}
            )
        else:
            merged[field] = value
    kube.replace(f"{path}/{doc['metadata']['name']}", merged)


def apply_k(plane: ControlPlane) -> str:
    """`kubectl apply -k packaging/kubernetes`; how it was done."""
    kubectl = find_kubectl(plane)
    if kubectl is not None:
        admin = str(plane.config_for("admin"))
        done = subprocess.run(
            [kubectl, "--kubeconfig", admin, "apply", "-k", str(MANIFESTS)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return f"kubectl apply -k ({kubectl})"
    kube = plane.kube()
    try:
        for doc in manifests(*kustomized()):
            apply_like_kubectl(kube, doc)
    finally:
        kube.close()
    return "no kubectl here: each listed file applied as kubectl apply would, by the Python client"


def test_apply_k_after_the_documented_secret_keeps_the_key(
    plane: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    kube = plane.kube()
    key = base64.b64encode(secrets.token_bytes(32)).decode()  # head -c 32 /dev/urandom | base64
    # kubectl -n hcs-system create secret generic hcs-assignment-key \
    #   --from-literal=k1.key=... --from-literal=signing=k1
    documented = {"k1.key": key, "signing": "k1"}
    kube.create(f"/api/v1/namespaces/{NAMESPACE}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": KEY_SECRET, "namespace": NAMESPACE},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in documented.items()},
    })  # fmt: skip
    try:
        for _ in range(2):  # the install, then an upgrade
            how = apply_k(plane)
            stored = kube.get(SECRET_PATH)["data"]
            assert {k: base64.b64decode(v).decode() for k, v in stored.items()} == documented
        with capsys.disabled():
            print(f"\n{Path(__file__).name}: {how}")
    finally:
        kube.request("DELETE", SECRET_PATH)
        kube.close()
