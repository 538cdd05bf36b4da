"""What `helm install` sets up schedules a pod: the chart's hcs-scheduler configuration,
RBAC, certificates, extender flags, keys and webhook, together, against the real API server.

No kubelet runs the release's pods, so its three programs run here as processes, each as the
release says: kube-scheduler v1.36.3 with the installed ConfigMap's configuration (its own
leader Lease, the extender over mutual TLS with the installed client certificate, checking
the extender's certificate for `hcs-scheduler-extender.hcs-system.svc`) and the token of the
release's `hcs-scheduler` ServiceAccount (so its RBAC is what is tested); the extender with
the installed Deployment's command line, Secrets and ServiceAccount; the webhook as in
test_webhook.py. What differs: addresses (loopback ports; the scheduler reaches the extender
at 127.0.0.1 and checks the certificate for the Service's name with `tlsConfig.serverName`)
and the node: a Node and its ComputeNode and heartbeat Lease are written by hand, as
hcs-syncer would write them (tests/cluster/test_cluster.py runs the real syncers and hcsd).

A pod asking for `ai.compute/vram: 16Gi` and naming no scheduler is bound by hcs-scheduler
through the extender, with an assignment signed by the node's key derived from the
generated Secret's key.
"""

from __future__ import annotations

import base64
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.kube import Kube, lease_object
from hcsd.cluster.objects import compute_node, node_spec, node_status
from hcsd.cluster.timefmt import micro_time, rfc3339
from hcsd.contract import assignment
from hcsd.contract.keyring import derive
from hcsd.contract.keyring_files import read_secret_dir
from hcsd.contract.names import LEADER_LEASE
from tests.cluster.controlplane import free_port, register_node, request_token, token_kubeconfig
from tests.cluster.helmchart import NAMESPACE, Helm, helm, secret_files, start_webhook
from tests.harness.peers.kubernetes import ensure_kubernetes

__all__ = ["helm"]  # the fixture

pytestmark = pytest.mark.slow

NODE = "gpu-node"
GiB = 2**30


def account_config(helm: Helm, account: str) -> Path:
    """A kubeconfig with a token of the release's ServiceAccount `account`."""
    kube = helm.plane.kube()
    token = request_token(kube, account, namespace=NAMESPACE)
    kube.close()
    path = helm.plane.work / f"{account}.kubeconfig"
    return token_kubeconfig(path, helm.plane.server, helm.plane.work / "certs", token)


def signing_kid(kube: Kube) -> str:
    """The key id the chart generated (random: k-<8 hex>)."""
    secret = kube.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/hcs-assignment-key")
    return base64.b64decode(secret["data"]["signing"]).decode()


def write_node(kube: Kube) -> None:
    """The Node, its ComputeNode (two A100 80GB, hcsd holding the generated key) and a fresh
    heartbeat."""
    register_node(kube, NODE)
    devices = [
        pb.Device(uuid=f"GPU-{i}", vendor="nvidia", model="A100-SXM4-80GB", index=i,
                  pci_bus_id=f"0000:1{i}:00.0", vram_bytes=80 * GiB, tflops_fp16=312.0,
                  health_score=100, health_state=pb.HEALTH_STATE_HEALTHY)
        for i in range(2)
    ]  # fmt: skip
    info = pb.Node(name=NODE, version="0.1.0", backends=["simulated"])
    created = kube.create(
        "/apis/hcs.io/v1alpha1/computenodes", compute_node(NODE, node_spec(info, devices))
    )
    status = node_status(
        devices, [], previous={}, now=rfc3339(time.time()), key_ids=[signing_kid(kube)]
    )
    kube.replace(f"/apis/hcs.io/v1alpha1/computenodes/{NODE}/status", {**created, "status": status})
    now = micro_time(time.time())
    kube.create(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases", lease_object(
        f"hcs-node-{NODE}", NAMESPACE,
        {"holderIdentity": NODE, "leaseDurationSeconds": 3600,
         "acquireTime": now, "renewTime": now},
    ))  # fmt: skip


def extender_command(kube: Kube, work: Path, ports: dict[str, int], config: Path) -> list[str]:
    """The installed Deployment's command, with this host's paths and ports."""
    deployment = kube.get(
        f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/hcs-scheduler-extender"
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {
        v["name"]: v["secret"]["secretName"]
        for v in deployment["spec"]["template"]["spec"]["volumes"]
    }
    local = {
        mounts[name]: str(secret_files(kube, secret, work / name))
        for name, secret in volumes.items()
    }
    command = []
    for word in container["command"][1:]:
        here = word
        for mount, directory in local.items():
            here = here.replace(mount, directory)
        for port, free in ports.items():
            here = here.replace(f"0.0.0.0:{port}", f"127.0.0.1:{free}")
        command.append(here)
    assert container["command"][0] == "hcs-scheduler-extender"
    return [sys.executable, "-m", "hcsd.cluster.extender_cli", *command,
            "--kubeconfig", str(config), "--identity", "extender-0"]  # fmt: skip


def scheduler_configuration(kube: Kube, work: Path, verbs: int, config: Path) -> Path:
    """The installed ConfigMap's configuration: its client certificate's files here, the
    extender at 127.0.0.1 checked for the Service's name, the ServiceAccount's token."""
    found = kube.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/hcs-scheduler-config")
    shipped: dict[str, Any] = yaml.safe_load(found["data"]["config.yaml"])
    deployment = kube.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/hcs-scheduler")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    client = secret_files(kube, volumes["tls"]["secret"]["secretName"], work / "client")
    (extender,) = shipped["extenders"]
    host = extender["urlPrefix"].removeprefix("https://").split(":")[0]
    assert host == f"hcs-scheduler-extender.{NAMESPACE}.svc"
    extender["urlPrefix"] = f"https://127.0.0.1:{verbs}/"
    tls = extender["tlsConfig"]
    for field in ("certFile", "keyFile", "caFile"):
        tls[field] = str(client / Path(tls[field]).name)
    tls["serverName"] = host
    shipped["clientConnection"] = {"kubeconfig": str(config)}
    path = work / "hcs-scheduler.yaml"
    path.write_text(yaml.safe_dump(shipped))
    return path


@pytest.fixture(scope="module")
def scheduling(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Helm]:
    binaries = ensure_kubernetes()
    if isinstance(binaries, str):
        pytest.skip(f"SKIP: {binaries}")
    work = tmp_path_factory.mktemp("scheduling")
    helm.install()
    plane = helm.plane
    kube = plane.kube()
    write_node(kube)
    ports = {8888: free_port(), 8889: free_port(), 8890: free_port()}
    extender_config = account_config(helm, "hcs-scheduler-extender")
    plane._spawn("extender", extender_command(kube, work, ports, extender_config))
    plane.wait_ready("extender", f"http://127.0.0.1:{ports[8889]}/readyz", timeout=60)
    scheduler_config = account_config(helm, "hcs-scheduler")
    config = scheduler_configuration(kube, work, ports[8888], scheduler_config)
    port = free_port()
    plane._spawn("kube-scheduler", [
        str(binaries / "kube-scheduler"), f"--config={config}",
        f"--authentication-kubeconfig={scheduler_config}",
        f"--authorization-kubeconfig={scheduler_config}",
        "--bind-address=127.0.0.1", f"--secure-port={port}", "-v=2",
    ])  # fmt: skip
    plane.wait_ready("kube-scheduler", f"https://127.0.0.1:{port}/readyz", timeout=60)
    start_webhook(helm, work / "webhook")
    kube.close()
    try:
        yield helm
    finally:
        for name in ("webhook", "kube-scheduler", "extender"):
            plane.stop_process(name)


def test_a_pod_asking_for_vram_is_bound_by_hcs_scheduler(scheduling: Helm) -> None:
    plane = scheduling.plane
    kube = plane.kube()
    pod = kube.create("/api/v1/namespaces/default/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train"},
        "spec": {"containers": [{"name": "main", "image": "busybox",
                                 "resources": {"limits": {"ai.compute/vram": "16Gi"}}}]},
    })  # fmt: skip
    assert pod["spec"]["schedulerName"] == "hcs-scheduler"  # the webhook
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not pod["spec"].get("nodeName"):
        time.sleep(0.3)
        pod = kube.get("/api/v1/namespaces/default/pods/train")
    assert pod["spec"].get("nodeName") == NODE, (
        f"{pod.get('status')}\n{plane.tail('kube-scheduler')}\n{plane.tail('extender')}"
    )
    # Signed with the node's key derived from the generated Secret's key.
    keys = derive(
        read_secret_dir(secret_files(kube, "hcs-assignment-key", plane.work / "keys")), NODE
    )
    text = pod["metadata"]["annotations"]["hcs.io/assignment"]
    signed = assignment.verify(
        text, keys.keys, node=NODE, pod_uid=pod["metadata"]["uid"], now=time.time(), max_age=600
    )
    (grant,) = signed.containers["main"]
    assert grant.vram_bytes == 16 * GiB and grant.device_uuid.startswith("GPU-")
    # hcs-scheduler led with its own Lease (the one its chart Role names).
    lease = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/hcs-scheduler")
    assert lease["spec"]["holderIdentity"]
    kube.close()


def test_uninstall_leaves_exactly_the_leases_the_programs_made(scheduling: Helm) -> None:
    """Helm deletes what it created; the Leases the running programs wrote (hcs-scheduler's
    and the extender's leader election, each node's heartbeat) are not its own and stay
    (docs/helm.md, Uninstall). Runs last in the module: the release is gone after it."""
    kube = scheduling.plane.kube()
    scheduling.uninstall()
    leases = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases")["items"]
    assert sorted(lease["metadata"]["name"] for lease in leases) == sorted(
        ["hcs-scheduler", LEADER_LEASE, f"hcs-node-{NODE}"]
    )
    kube.close()
