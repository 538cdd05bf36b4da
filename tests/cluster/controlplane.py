"""A real Kubernetes control plane on loopback: etcd, kube-apiserver and kube-scheduler.

Certificates are made at start with openssl (a CA, the apiserver's serving cert, client certs
for the admin, the scheduler and HCS's two service accounts), so RBAC is exercised for real:
the syncer and the extender run as `system:serviceaccount:hcs-system:<name>` and get exactly
what packaging/kubernetes/rbac-*.yaml grants. No kubelet: Node objects are created by hand
(with TaintNodesByCondition off so they are schedulable). kube-controller-manager only on
demand (`controller_manager`, for Jobs and garbage collection): most suites need none of its
controllers and it costs a process and a certificate.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hcsd.cluster.kube import Kube, KubeError

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "packaging" / "kubernetes"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(directory: Path, clients: dict[str, tuple[str, str]]) -> None:
    """ca.{crt,key}, apiserver.{crt,key}, extender-serving.{crt,key}, sa.{key,pub} and
    <name>.{crt,key} per client."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "2", "-subj", "/CN=hcs-test-ca", cwd=directory)  # fmt: skip
    (directory / "san.ext").write_text(
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes.default.svc\n"
    )
    _sign(directory, "apiserver", "/CN=kube-apiserver", ext="san.ext")
    # The extender's serving certificate: kube-scheduler checks it against the same CA.
    _sign(directory, "extender-serving", "/CN=hcs-scheduler-extender", ext="san.ext")
    for name, (cn, org) in clients.items():
        _sign(directory, name, f"/CN={cn}" + (f"/O={org}" if org else ""))
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)


def _sign(directory: Path, name: str, subject: str, ext: str = "") -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject, cwd=directory)  # fmt: skip
    extra = ["-extfile", ext] if ext else []
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", *extra,
             cwd=directory)  # fmt: skip


def kubeconfig(path: Path, server: str, certs: Path, client: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "hcs", "cluster": {"server": server,
                                                 "certificate-authority": str(certs / "ca.crt")}}],
        "users": [{"name": client, "user": {"client-certificate": str(certs / f"{client}.crt"),
                                           "client-key": str(certs / f"{client}.key")}}],
        "contexts": [{"name": "hcs", "context": {"cluster": "hcs", "user": client}}],
        "current-context": "hcs",
    }  # fmt: skip
    path.write_text(yaml.safe_dump(config))
    return path


CLIENTS = {
    "admin": ("hcs-admin", "system:masters"),
    "scheduler": ("system:kube-scheduler", ""),
    "syncer": ("system:serviceaccount:hcs-system:hcs-syncer", "system:serviceaccounts"),
    "extender": (
        "system:serviceaccount:hcs-system:hcs-scheduler-extender",
        "system:serviceaccounts",
    ),
    "controller": ("system:serviceaccount:hcs-system:hcs-controller", "system:serviceaccounts"),
}
#: kube-controller-manager's client certificate (its user, as the bootstrap RBAC names it).
CONTROLLER_MANAGER = {"controller-manager": ("system:kube-controller-manager", "")}


@dataclass
class ControlPlane:
    """Start with `start()`; `admin` is a Kube with cluster-admin rights."""

    binaries: Path
    etcd: Path
    work: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    api_port: int = 0
    etcd_port: int = 0
    # Client certificates to make (name: (CN, O)) and kube-apiserver flags to add: the
    # real-kubelet cluster adds its nodes, kube-controller-manager and the kubelet client.
    clients: dict[str, tuple[str, str]] = field(default_factory=lambda: dict(CLIENTS))
    apiserver_args: list[str] = field(default_factory=list)
    # Off by default: nothing removes the not-ready taint without a controller-manager, and
    # without one no namespace gets its `default` ServiceAccount for pods to name. (One flag:
    # a second --disable-admission-plugins would add to the list, not replace it.)
    disabled_admission: tuple[str, ...] = ("TaintNodesByCondition", "ServiceAccount")
    # kube-controller-manager's binary: set, it starts after the API server (Jobs, garbage
    # collection); None, it does not run unless `start_controller_manager` is called.
    controller_manager: Path | None = None

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def config_for(self, client: str) -> Path:
        return self.work / f"{client}.kubeconfig"

    def kube(self, client: str = "admin") -> Kube:
        return Kube.connect(str(self.config_for(client)))

    def syncer_config(self, node: str) -> Path:
        """A kubeconfig for `node`'s hcs-syncer with the token its DaemonSet pod would have:
        the syncer's account, bound to a pod on that node (admission-syncer.yaml needs it)."""
        admin = self.kube()
        token = request_token(admin, "hcs-syncer", pod=syncer_pod(admin, node))
        admin.close()
        path = self.work / f"syncer-{node}.kubeconfig"
        return token_kubeconfig(path, self.server, self.work / "certs", token)

    def syncer_kube(self, node: str) -> Kube:
        return Kube.connect(str(self.syncer_config(node)))

    def start(self) -> ControlPlane:
        certs = self.work / "certs"
        if self.controller_manager is not None:
            self.clients = self.clients | CONTROLLER_MANAGER
        if not (certs / "ca.crt").exists():
            make_certs(certs, self.clients)
        for client in self.clients:
            kubeconfig(
                self.config_for(client), f"https://127.0.0.1:{self.api_port or 0}", certs, client
            )
        self.etcd_port = self.etcd_port or free_port()
        self.api_port = self.api_port or free_port()
        for client in self.clients:
            kubeconfig(self.config_for(client), self.server, certs, client)
        self.start_etcd()
        self.start_apiserver()
        if self.controller_manager is not None:
            self.start_controller_manager(self.controller_manager)
        return self

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.work / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.processes[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def start_etcd(self) -> None:
        data = self.work / "etcd"
        self._spawn("etcd", [
            str(self.etcd), "--data-dir", str(data), "--name", "hcs-test",
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{free_port()}",
            "--unsafe-no-fsync", "--quota-backend-bytes", str(4 * 1024**3),
        ])  # fmt: skip

    def start_apiserver(self) -> None:
        certs = self.work / "certs"
        self._spawn("kube-apiserver", [
            str(self.binaries / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.api_port}",
            f"--tls-cert-file={certs / 'apiserver.crt'}",
            f"--tls-private-key-file={certs / 'apiserver.key'}",
            f"--client-ca-file={certs / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={certs / 'sa.pub'}",
            f"--service-account-signing-key-file={certs / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--authorization-mode=Node,RBAC",
            "--endpoint-reconciler-type=none",
            f"--disable-admission-plugins={','.join(self.disabled_admission)}",
            "--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000",
            *self.apiserver_args,
        ])  # fmt: skip
        self.wait_ready("kube-apiserver", f"{self.server}/readyz", timeout=60)

    def wait_ready(self, name: str, url: str, timeout: float) -> None:
        certs = self.work / "certs"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            process = self.processes[name]
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited {process.returncode}: {self.tail(name)}")
            done = subprocess.run(
                ["curl", "-fsS", "--max-time", "2", "--cacert", str(certs / "ca.crt"),
                 "--cert", str(certs / "admin.crt"), "--key", str(certs / "admin.key"), "-k", url],
                capture_output=True, check=False,
            )  # fmt: skip
            if done.returncode == 0:
                return
            time.sleep(0.3)
        raise RuntimeError(f"{name} not ready in {timeout}s: {self.tail(name)}")

    def start_controller_manager(
        self, binary: Path, controllers: str = "*", args: Sequence[str] = ()
    ) -> None:
        """kube-controller-manager as `system:kube-controller-manager` (the client
        `controller-manager`, which `clients` must hold), every controller its own
        service account (`--use-service-account-credentials`: the DaemonSet controller writes
        ControllerRevisions, which the manager's own identity may not), no leader election,
        its log in the plane's directory. `controllers` is its `--controllers` list: `*`, the
        default set, holds what Jobs need (`job-controller`, `garbage-collector-controller`,
        `pod-garbage-collector-controller`, `ttl-after-finished-controller`) and what pods
        need with the ServiceAccount admission plugin on (`serviceaccount-controller`, the
        `default` accounts; `root-ca-certificate-publisher-controller`, `kube-root-ca.crt`).
        `args`: more flags (bench/dra_bench.py sets its client's QPS)."""
        certs = self.work / "certs"
        config = self.config_for("controller-manager")
        port = free_port()
        self._spawn("kube-controller-manager", [
            str(binary), f"--kubeconfig={config}", f"--controllers={controllers}",
            f"--authentication-kubeconfig={config}", f"--authorization-kubeconfig={config}",
            "--bind-address=127.0.0.1", f"--secure-port={port}", "--leader-elect=false",
            f"--service-account-private-key-file={certs / 'sa.key'}",
            f"--root-ca-file={certs / 'ca.crt'}", "--use-service-account-credentials=true",
            # Its default would create /usr/libexec/kubernetes on the host.
            f"--flex-volume-plugin-dir={self.work / 'flex-volumes'}",
            "--service-cluster-ip-range=10.96.0.0/16", "-v=1", *args,
        ])  # fmt: skip
        self.wait_ready("kube-controller-manager", f"https://127.0.0.1:{port}/healthz", 60)

    def extender_tls(self) -> list[str]:
        """hcs-scheduler-extender's flags for mutual TLS with this plane's kube-scheduler: its
        serving certificate and the CA of kube-scheduler's client certificate."""
        certs = self.work / "certs"
        return ["--tls-cert", str(certs / "extender-serving.crt"),
                "--tls-key", str(certs / "extender-serving.key"),
                "--tls-client-ca", str(certs / "ca.crt")]  # fmt: skip

    def start_scheduler(self, extender_url: str | None, *, qps: int = 500) -> None:
        """kube-scheduler with our extender (from hcs-scheduler's shipped configuration, as
        its default profile) or without. An https URL is called as the shipped configuration
        does: kube-scheduler presents its client certificate (CN system:kube-scheduler here)
        through the extender's tlsConfig."""
        shipped = scheduler_configuration()
        config: dict[str, Any] = dict(shipped)
        config.pop("profiles", None)  # the default profile: the tests' pods name no scheduler
        config["clientConnection"] = {
            "kubeconfig": str(self.config_for("scheduler")),
            "qps": qps,
            "burst": qps * 2,
        }
        config["leaderElection"] = {"leaderElect": False}
        if extender_url is None:
            config.pop("extenders", None)
        else:
            certs = self.work / "certs"
            secure = extender_url.startswith("https://")
            tls = {
                "certFile": str(certs / "scheduler.crt"),
                "keyFile": str(certs / "scheduler.key"),
                "caFile": str(certs / "ca.crt"),
            }
            extenders = []
            for shipped_extender in shipped["extenders"]:
                extender = {**shipped_extender, "urlPrefix": extender_url, "enableHTTPS": secure}
                extender.pop("tlsConfig", None)
                if secure:
                    extender["tlsConfig"] = tls
                extenders.append(extender)
            config["extenders"] = extenders
        path = self.work / "scheduler-config.yaml"
        path.write_text(yaml.safe_dump(config))
        port = free_port()
        self._spawn("kube-scheduler", [
            str(self.binaries / "kube-scheduler"), f"--config={path}",
            f"--authentication-kubeconfig={self.config_for('scheduler')}",
            f"--authorization-kubeconfig={self.config_for('scheduler')}",
            "--bind-address=127.0.0.1", f"--secure-port={port}", "-v=1",
        ])  # fmt: skip
        self.wait_ready("kube-scheduler", f"https://127.0.0.1:{port}/readyz", timeout=60)

    def stop_process(self, name: str) -> None:
        process = self.processes.pop(name, None)
        if process is None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop(self) -> None:
        for name in ("kube-controller-manager", "kube-scheduler", "kube-apiserver", "etcd"):
            self.stop_process(name)

    def tail(self, name: str, lines: int = 30) -> str:
        path = self.work / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def apply(self, documents: list[dict[str, Any]]) -> None:
        """Create (or replace) objects as cluster-admin; CRDs are waited for until served."""
        kube = self.kube()
        for doc in documents:
            path = _collection_path(doc)
            try:
                kube.create(path, doc)
            except Exception as e:
                if getattr(e, "conflict", False):
                    continue
                raise RuntimeError(f"applying {doc['kind']} {doc['metadata']['name']}: {e}") from e
            if doc["kind"] == "CustomResourceDefinition":
                name = doc["metadata"]["name"]
                for _ in range(100):
                    crd = kube.get(
                        f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
                    )
                    conditions = {
                        c["type"]: c["status"]
                        for c in (crd.get("status") or {}).get("conditions") or []
                    }
                    if conditions.get("Established") == "True":
                        break
                    time.sleep(0.1)
        time.sleep(0.5)  # discovery of new CRDs by the RBAC authorizer and clients
        kube.close()


_PLURALS = {
    "Namespace": "namespaces", "ServiceAccount": "serviceaccounts", "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings", "Role": "roles", "RoleBinding": "rolebindings",
    "Secret": "secrets", "CustomResourceDefinition": "customresourcedefinitions",
    "DaemonSet": "daemonsets", "Deployment": "deployments", "Service": "services",
    "Node": "nodes", "Pod": "pods", "ComputeQuota": "computequotas", "ComputeNode": "computenodes",
    "NetworkPolicy": "networkpolicies", "ConfigMap": "configmaps",
    "ResourceQuota": "resourcequotas", "RuntimeProfile": "runtimeprofiles",
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
    "DeviceClass": "deviceclasses", "ResourceSlice": "resourceslices",
    "ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates",
}  # fmt: skip


def _collection_path(doc: dict[str, Any]) -> str:
    version = doc["apiVersion"]
    base = f"/api/{version}" if "/" not in version else f"/apis/{version}"
    namespace = doc["metadata"].get("namespace")
    return base + (f"/namespaces/{namespace}" if namespace else "") + "/" + _PLURALS[doc["kind"]]


def scheduler_configuration() -> dict[str, Any]:
    """hcs-scheduler's KubeSchedulerConfiguration, from its ConfigMap in scheduler.yaml."""
    (config_map,) = [d for d in manifests("scheduler.yaml") if d["kind"] == "ConfigMap"]
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])
    return config


def manifests(*names: str) -> list[dict[str, Any]]:
    docs = []
    for name in names:
        docs += [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]
    return docs


@contextlib.contextmanager
def running(binaries: Path, etcd: Path, work: Path) -> Iterator[ControlPlane]:
    plane = ControlPlane(binaries, etcd, work).start()
    try:
        yield plane
    finally:
        plane.stop()


def node_object(name: str) -> dict[str, Any]:
    """A Node without a kubelet: Ready, with room for pods, so kube-scheduler considers it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "pods": "250"},
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "250"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "test node", "lastHeartbeatTime": None,
                            "lastTransitionTime": None}],
        },
    }  # fmt: skip


def register_node(kube: Kube, name: str) -> None:
    """Create the Node, then set its status (the create ignores status)."""
    body = node_object(name)
    created = kube.create("/api/v1/nodes", body)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = json.loads(json.dumps(body["status"]))
    for c in status["conditions"]:
        c["lastHeartbeatTime"] = now
        c["lastTransitionTime"] = now
    kube.request("PUT", f"/api/v1/nodes/{name}/status", body={**created, "status": status})


def token_kubeconfig(path: Path, server: str, certs: Path, token: str) -> Path:
    """A kubeconfig that authenticates with a bearer token (a service account's)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "hcs", "cluster": {"server": server,
                                                 "certificate-authority": str(certs / "ca.crt")}}],
        "users": [{"name": "token", "user": {"token": token}}],
        "contexts": [{"name": "hcs", "context": {"cluster": "hcs", "user": "token"}}],
        "current-context": "hcs",
    }  # fmt: skip
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def request_token(
    kube: Kube,
    account: str,
    *,
    namespace: str = "hcs-system",
    pod: dict[str, Any] | None = None,
    node: dict[str, Any] | None = None,
    audience: str = "",
) -> str:
    """A TokenRequest for `account`, bound to `pod` or `node` (as kubelet's projected token
    is bound to its pod) or to nothing; for `audience`, else the API server's."""
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if audience:
        spec["audiences"] = [audience]
    bound = pod or node
    if bound is not None:
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": bound["kind"],
            "name": bound["metadata"]["name"],
            "uid": bound["metadata"]["uid"],
        }
    answer = kube.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(answer["status"]["token"])


def syncer_pod(kube: Kube, node: str, account: str = "hcs-syncer") -> dict[str, Any]:
    """The DaemonSet's pod on `node` as the API server holds it (spec.nodeName set; no kubelet
    runs it): its tokens name the node. The Node is registered first if it is missing."""
    try:
        kube.get(f"/api/v1/nodes/{node}")
    except KubeError as e:
        if not e.not_found:
            raise
        register_node(kube, node)
    name = f"{account}-{node}"
    path = f"/api/v1/namespaces/hcs-system/pods/{name}"
    try:
        return kube.get(path)
    except KubeError as e:
        if not e.not_found:
            raise
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "hcs-system"},
        "spec": {"nodeName": node, "serviceAccountName": account,
                 "containers": [{"name": "syncer", "image": "hcs/hcsd"}]},
    }  # fmt: skip
    return kube.create("/api/v1/namespaces/hcs-system/pods", pod)


def which(name: str) -> str | None:
    return shutil.which(name) or (name if os.access(name, os.X_OK) else None)
