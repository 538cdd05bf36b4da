"""The cluster fixture: a real control plane, hcsd + hcs-syncer per node, the extender and
kube-scheduler using it. Built once per module (about 15 s warm); skips loudly when the
Kubernetes binaries or etcd cannot be had."""

from __future__ import annotations

import base64
import json
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from hcsd.cluster.kube import Kube, KubeError
from hcsd.contract.keyring import Keyring, derive
from tests.cluster.controlplane import (
    MANIFESTS,
    ControlPlane,
    free_port,
    manifests,
    register_node,
    request_token,
    syncer_pod,
)
from tests.harness.daemon import LIBHCS, Daemon, build_libhcs
from tests.harness.peers.kubernetes import ensure_kubernetes, find_etcd

GiB = 2**30
MANUAL_SCHEDULER = "hcs-test-manual"  # served by the extender, not by the test's kube-scheduler


def node_file(
    path: Path, prefix: str, devices: list[dict[str, Any]], link: tuple[str, float] | None
) -> Path:
    """A simulated node: `devices` as (vendor, model, vram, tflops, health, score,
    attributes) dicts."""
    lines: list[str] = []
    uuids = []
    for index, d in enumerate(devices):
        uuid = f"{prefix}-{index:04d}-0000-0000-000000000000"
        uuids.append(uuid)
        lines += [
            "[[device]]",
            f'uuid = "{uuid}"',
            f'vendor = "{d["vendor"]}"',
            f'model = "{d["model"]}"',
            f"index = {index}",
            f'pci_bus_id = "0000:{0x17 + index:02x}:00.0"',
            f'vram = "{d["vram"]}"',
            f"tflops_fp16 = {d['tflops']}",
            f'nodes = ["/dev/{prefix.lower()}{index}:240:{index}"]',
            f'health_state = "{d.get("health", "healthy")}"',
            f"health_score = {d.get('score', 100)}",
            *(
                ["[device.attributes]", *(f'{k} = "{v}"' for k, v in d["attributes"].items())]
                if d.get("attributes")
                else []
            ),
            "",
        ]
    if link is not None:
        for i, a in enumerate(uuids):
            for b in uuids[i + 1 :]:
                lines += [
                    "[[link]]",
                    f'a = "{a}"',
                    f'b = "{b}"',
                    f'kind = "{link[0]}"',
                    f"gbps = {link[1]}",
                    "",
                ]
    path.write_text("\n".join(lines))
    return path


A100 = {"vendor": "nvidia", "model": "A100-SXM4-80GB", "vram": "80Gi", "tflops": 312}
NPU = {"vendor": "ascend", "model": "Ascend910B3", "vram": "64Gi", "tflops": 313}
MLU = {"vendor": "cambricon", "model": "MLU370-X8", "vram": "48Gi", "tflops": 96}
NPU_FAULT = "heartbeat-lost: device heartbeat lost"
DCU = {"vendor": "hygon", "model": "Z100", "vram": "32Gi", "tflops": 24.5}

NODES: dict[str, tuple[str, list[dict[str, Any]], tuple[str, float] | None]] = {
    "gpu-node": ("GPU", [A100, A100], ("nvlink", 300)),
    # The reason and the fingerprint as hcsd's health watcher and a node's measurement set them
    "npu-node": (
        "NPU",
        [
            {**NPU, "health": "unhealthy", "score": 20, "attributes": {"health_reason": NPU_FAULT}},
            NPU,
        ],
        ("hccs", 56),
    ),
    "mlu-node": (
        "MLU",
        [{**MLU, "attributes": {"fingerprint": "measured"}}, MLU, MLU, MLU],
        ("mlulink", 100),
    ),
    "dcu-node": ("DCU", [DCU], None),
}


class NodeDaemon(Daemon):
    """hcsd for one simulated node, named as its Kubernetes Node; its keys come from its
    hcs-syncer (InstallKeys), as on a real node."""

    def __init__(self, directory: Path, name: str, node: Path) -> None:
        self.name = name
        self.keyring_file = directory / "state" / "keyring.json"
        super().__init__(
            directory,
            node_file=node,
            settings={
                "node": {"name": name},
                "runtime": {
                    "assignment_keyring_file": self.keyring_file,
                    "assignment_key_file": directory / "no-legacy.key",
                    "libhcs_path": LIBHCS,
                },
            },
        )

    def key_ids(self) -> set[str]:
        """The key ids hcsd holds now (its keyring file; root-only, and the tests are root)."""
        if not self.keyring_file.exists():
            return set()
        return set(json.loads(self.keyring_file.read_text())["keys"])


@dataclass
class Cluster:
    plane: ControlPlane
    work: Path
    keys: Keyring  # the cluster keyring, as the Secret holds it now
    daemons: dict[str, NodeDaemon] = field(default_factory=dict)
    syncers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    extender: subprocess.Popen[bytes] | None = None
    extender_port: int = 0
    probe_port: int = 0
    node_keys_port: int = 0
    admin: Kube | None = None

    @property
    def secret(self) -> Path:
        """The extender's Secret volume: `<kid>.key` files and `signing`."""
        return self.work / "secret"

    def write_secret(self, keys: Keyring) -> None:
        """Change the Secret as `kubectl apply` and kubelet would (files in place)."""
        self.secret.mkdir(exist_ok=True)
        for old in self.secret.iterdir():
            old.unlink()
        for kid, key in keys.keys.items():
            (self.secret / f"{kid}.key").write_bytes(key)
        (self.secret / "signing").write_text(keys.signing)
        if keys.retired:
            (self.secret / "retired").write_text("\n".join(sorted(keys.retired)))
        for path in self.secret.iterdir():
            path.chmod(0o440)  # as mounted for it: the group is the process's own
        self.keys = keys

    def node_keys(self, node: str) -> dict[str, bytes]:
        """What `node` verifies with when its syncer has fetched the current keys."""
        return dict(derive(self.keys, node).keys)

    @property
    def kube(self) -> Kube:
        assert self.admin is not None
        return self.admin

    def start_syncer(self, name: str, *, fetch_keys: bool = True) -> None:
        """As the DaemonSet runs it: its pod's token for the API (admission-syncer.yaml wants
        the node in it), a projected token of audience hcs-node-keys for its keys;
        `fetch_keys=False`: one that does not fetch them (hcsd keeps what it holds)."""
        admin = self.plane.kube()
        pod = syncer_pod(admin, name)
        token = self.work / f"syncer-{name}.token"
        token.write_text(request_token(admin, "hcs-syncer", pod=pod, audience="hcs-node-keys"))
        admin.close()
        self.node_keys_port = self.node_keys_port or free_port()
        log = open(self.work / f"syncer-{name}.log", "ab")  # noqa: SIM115
        self.syncers[name] = subprocess.Popen(
            [sys.executable, "-m", "hcsd.cluster.syncer_cli", "--node-name", name,
             "--socket", self.daemons[name].socket,
             "--kubeconfig", str(self.plane.syncer_config(name)),
             "--lease-seconds", "8", "--renew-seconds", "2", "--resync-seconds", "30",
             *(["--node-keys-url", f"https://127.0.0.1:{self.node_keys_port}/node-keys"]
               if fetch_keys else []),
             "--node-keys-ca", str(self.work / "certs" / "ca.crt"),
             "--token-file", str(token), "--keys-seconds", "2"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def kill_syncer(self, name: str) -> None:
        process = self.syncers.pop(name)
        process.send_signal(signal.SIGKILL)
        process.wait()

    @property
    def extender_url(self) -> str:
        """Where kube-scheduler calls the extender: mutual TLS, as the manifests ship it."""
        return f"https://127.0.0.1:{self.extender_port}/"

    @property
    def probe_url(self) -> str:
        return f"http://127.0.0.1:{self.probe_port}"

    def extender_command(self, port: int, probes: int, identity: str, keys_port: int) -> list[str]:
        """As the Deployment runs it: the Secret's directory, and the node-keys port serving
        the extender's own certificate (as the manifests do)."""
        certs = self.work / "certs"
        return [
            sys.executable, "-m", "hcsd.cluster.extender_cli",
            "--listen", f"127.0.0.1:{port}",
            "--probe-listen", f"127.0.0.1:{probes}", *self.plane.extender_tls(),
            "--keys-dir", str(self.secret), "--keys-reload-seconds", "0.5",
            "--node-keys-listen", f"127.0.0.1:{keys_port}",
            "--node-keys-cert", str(certs / "extender-serving.crt"),
            "--node-keys-key", str(certs / "extender-serving.key"),
            "--kubeconfig", str(self.plane.config_for("extender")), "--leader-elect",
            "--identity", identity, "--quota-status-seconds", "0.5",
            # kube-scheduler's default profile, and one no kube-scheduler here runs, for the
            # tests that call bind themselves.
            "--scheduler-name", "default-scheduler", "--scheduler-name", MANUAL_SCHEDULER,
        ]  # fmt: skip

    def start_extender(self) -> None:
        self.extender_port = self.extender_port or free_port()
        self.probe_port = self.probe_port or free_port()
        self.node_keys_port = self.node_keys_port or free_port()
        log = open(self.work / "extender.log", "ab")  # noqa: SIM115
        self.extender = subprocess.Popen(
            self.extender_command(
                self.extender_port, self.probe_port, "extender-0", self.node_keys_port
            ),
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.plane.processes["extender"] = self.extender  # for wait_ready's exit check
        self.plane.wait_ready("extender", f"{self.probe_url}/readyz", 60)

    def stop_extender(self) -> None:
        """SIGTERM, as a Deployment's pod is stopped; "extender-0" gives its Lease back."""
        assert self.extender is not None
        self.extender.terminate()
        self.extender.wait(30)
        self.plane.processes.pop("extender", None)
        self.extender = None

    def wait_keys(self, kids: set[str], timeout: float = 30) -> None:
        """Until every node's hcsd holds exactly `kids`, as an operator sees it between the
        steps of a rotation: `status.assignmentKeys` of the ComputeNodes. Its hcsd's keyring
        file says the same."""
        deadline = time.monotonic() + timeout
        held: dict[str, set[str]] = {}
        while time.monotonic() < deadline:
            items = self.kube.get("/apis/hcs.io/v1alpha1/computenodes").get("items", [])
            held = {
                i["metadata"]["name"]: set((i.get("status") or {}).get("assignmentKeys") or [])
                for i in items
                if i["metadata"]["name"] in self.daemons
            }
            if len(held) == len(self.daemons) and all(k == kids for k in held.values()):
                assert all(d.key_ids() == kids for d in self.daemons.values())
                return
            time.sleep(0.2)
        raise AssertionError(f"nodes hold {held}, not {kids}:\n" + self.log("syncer-gpu-node"))

    def log(self, name: str) -> str:
        path = self.work / f"{name}.log"
        return path.read_text(errors="replace")[-5000:] if path.exists() else ""

    def wait_compute_nodes(self, timeout: float = 30) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        found: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            items = self.kube.get("/apis/hcs.io/v1alpha1/computenodes").get("items", [])
            found = {i["metadata"]["name"]: i for i in items if i.get("status")}
            if set(found) >= set(self.daemons):
                return found
            time.sleep(0.2)
        raise AssertionError(
            f"ComputeNodes {sorted(found)} of {sorted(self.daemons)}; syncer log:\n"
            + self.log(f"syncer-{next(iter(self.daemons))}")
        )

    def create_pod(
        self,
        name: str,
        *,
        namespace: str = "default",
        resources: dict[str, str],
        annotations: dict[str, str] | None = None,
        containers: int = 1,
    ) -> dict[str, Any]:
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
            "spec": {
                "containers": [
                    {"name": f"main{i}" if i else "main", "image": "busybox",
                     "resources": {"limits": resources}}
                    for i in range(containers)
                ],
            },
        }  # fmt: skip
        return self.kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)

    def wait_pod(
        self, name: str, *, namespace: str = "default", timeout: float = 30
    ) -> dict[str, Any]:
        """The pod once it is bound or marked unschedulable."""
        deadline = time.monotonic() + timeout
        pod: dict[str, Any] = {}
        while time.monotonic() < deadline:
            pod = self.kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            if pod["spec"].get("nodeName"):
                return pod
            for c in pod.get("status", {}).get("conditions", []):
                if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
                    return pod
            time.sleep(0.2)
        raise AssertionError(
            f"pod {name} neither bound nor unschedulable: {pod.get('status')}\n"
            + self.log("extender")
            + self.plane.tail("kube-scheduler")
        )

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        try:
            self.kube.request(
                "DELETE",
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                body={"gracePeriodSeconds": 0},
            )
        except KubeError as e:
            if not e.not_found:
                raise


def unschedulable_message(pod: dict[str, Any]) -> str:
    for c in pod.get("status", {}).get("conditions", []):
        if c["type"] == "PodScheduled":
            return str(c.get("message", ""))
    return ""


def _requirements() -> tuple[Path, Path]:
    binaries = ensure_kubernetes()
    if isinstance(binaries, str):
        pytest.skip(f"SKIP cluster tests: {binaries}")
    etcd = find_etcd()
    if isinstance(etcd, str):
        pytest.skip(f"SKIP cluster tests: {etcd}")
    for tool in ("openssl", "curl"):
        if subprocess.run(["which", tool], capture_output=True, check=False).returncode:
            pytest.skip(f"SKIP cluster tests: {tool} is not installed")
    return binaries, etcd


def kustomized() -> list[str]:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    return list(kustomization["resources"])


def secret_with(keys: Keyring) -> list[dict[str, Any]]:
    docs = manifests("secret.yaml")
    for doc in docs:
        doc.pop("stringData", None)
        doc["data"] = {
            **{f"{k}.key": base64.b64encode(v).decode() for k, v in keys.keys.items()},
            "signing": base64.b64encode(keys.signing.encode()).decode(),
        }
    return docs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    binaries, etcd = _requirements()
    if not LIBHCS.exists():  # hcsd checks that what it injects exists
        build_libhcs()
    work = tmp_path_factory.mktemp("cluster")
    plane = ControlPlane(binaries, etcd, work).start()
    keys = Keyring({"k1": secrets.token_hex(32).encode()}, "k1")
    c = Cluster(plane, work, keys)
    try:
        # Everything the kustomization ships, validated by the real API server (nothing runs
        # the DaemonSet and Deployment here: there is no kubelet), with a real key.
        shipped = [d for d in manifests(*kustomized()) if d["kind"] != "Secret"]
        plane.apply(shipped + secret_with(keys))
        c.admin = plane.kube()
        c.write_secret(keys)  # the extender's Secret volume; hcsd starts without a key
        for name, (prefix, devices, link) in NODES.items():
            directory = work / name
            directory.mkdir()
            node = node_file(directory / "node.toml", prefix, devices, link)
            daemon = NodeDaemon(directory, name, node)
            daemon.start()
            c.daemons[name] = daemon
            register_node(c.kube, name)
            c.start_syncer(name)
        c.wait_compute_nodes()
        c.start_extender()
        c.wait_keys({"k1"})  # each syncer fetched its node's keys from the extender
        plane.start_scheduler(c.extender_url)
        yield c
    finally:
        for process in [*c.syncers.values(), *([c.extender] if c.extender else [])]:
            process.kill()
            process.wait()
        for daemon in c.daemons.values():
            daemon.close()
        plane.stop()


@pytest.fixture(scope="session")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd and kube-apiserver only, with the shipped CRDs and RBAC: for tests of one cluster
    part at a time (leader election, the syncer, bind), which bring their own peers."""
    binaries, etcd = _requirements()
    work = tmp_path_factory.mktemp("plane")
    control = ControlPlane(binaries, etcd, work).start()
    try:
        control.apply([d for d in manifests(*kustomized()) if d["kind"] != "Secret"])
        yield control
    finally:
        control.stop()
