"""One node cannot write for another nor get another's keys, on a real
kube-apiserver v1.36 with the shipped manifests (admission-syncer.yaml, the RBAC).

Two syncer identities: the hcs-syncer service account with tokens bound to pods on node A and
node B (TokenRequest with boundObjectRef, as kubelet makes the DaemonSet's projected token;
the Nodes and pods are created by hand, no kubelet runs them). Each tries to write its own and
the other's ComputeNode and heartbeat Lease; each asks the extender's node-keys endpoint.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hcsd.cluster.key_fetch import KeyFetchError, fetch
from hcsd.cluster.kube import Kube, KubeError, lease_object
from hcsd.cluster.node_keys import ClusterKeys, NodeKeys
from hcsd.cluster.node_keys_http import serve_node_keys
from hcsd.cluster.timefmt import micro_time
from hcsd.contract.keyring import Keyring, decode, derive
from tests.cluster.controlplane import (
    ControlPlane,
    _sign,
    request_token,
    syncer_pod,
    token_kubeconfig,
)
from tests.unit.fleet import node_object

pytestmark = pytest.mark.slow

NODES = "/apis/hcs.io/v1alpha1/computenodes"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/hcs-system/leases"
K1 = b"cluster-key-one-0123456789abcdef-0123456789"
K2 = b"cluster-key-two-0123456789abcdef-0123456789"
K3 = b"cluster-key-three-0123456789abcdef-012345678"


def as_token(plane: ControlPlane, name: str, token: str) -> Kube:
    path = token_kubeconfig(plane.work / f"{name}.kubeconfig", plane.server,
                            plane.work / "certs", token)  # fmt: skip
    return Kube.connect(str(path))


def compute_node(name: str) -> dict[str, Any]:
    obj = node_object(name, count=1)
    obj.pop("status")
    del obj["metadata"]["resourceVersion"]
    return obj


def lease(node: str) -> dict[str, Any]:
    now = micro_time(time.time())
    spec = {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now}
    return lease_object(f"hcs-node-{node}", "hcs-system", spec)


def refused(call: Callable[[], object]) -> str:
    with pytest.raises(KubeError) as e:
        call()
    assert e.value.status == 403, e.value
    return str(e.value)


def until_enforced(kube: Kube, admin: Kube, node: str) -> None:
    """The policy is compiled by the API server's informers a moment after it is created:
    wait until `kube` is refused `node`'s ComputeNode (removing any it made meanwhile)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            kube.create(NODES, compute_node(node))
        except KubeError as e:
            if e.status == 403:
                return
            raise
        admin.request("DELETE", f"{NODES}/{node}")
        time.sleep(0.3)
    raise AssertionError("admission-syncer.yaml's policy was never enforced")


@pytest.fixture(scope="module")
def syncers(plane: ControlPlane) -> Iterator[dict[str, Kube]]:
    admin = plane.kube()
    kubes = {node: plane.syncer_kube(node) for node in ("ident-a", "ident-b")}
    until_enforced(kubes["ident-a"], admin, "ident-b")
    yield kubes
    for kube in kubes.values():
        kube.close()
    admin.close()


def test_each_syncer_writes_its_own_compute_node_and_lease_only(
    syncers: dict[str, Kube],
) -> None:
    a, b = syncers["ident-a"], syncers["ident-b"]
    a.create(NODES, compute_node("ident-a"))  # its own: allowed, as the syncer does
    patched = a.patch(f"{NODES}/ident-a", {"spec": {"hcsdVersion": "0.1.1"}})
    status = node_object("ident-a", count=1)["status"]
    a.replace(f"{NODES}/ident-a/status", {**patched, "status": status})
    held = a.create(LEASES, lease("ident-a"))
    a.replace(f"{LEASES}/hcs-node-ident-a", held)
    b.create(NODES, compute_node("ident-b"))
    b.create(LEASES, lease("ident-b"))

    message = refused(lambda: a.patch(f"{NODES}/ident-b", {"spec": {"devices": []}}))
    assert "hcs-syncer of node ident-a may write only ident-a, not ident-b" in message
    current = b.get(f"{NODES}/ident-b")
    refused(lambda: a.replace(f"{NODES}/ident-b/status", {**current, "status": status}))
    other = b.get(f"{LEASES}/hcs-node-ident-b")
    message = refused(lambda: a.replace(f"{LEASES}/hcs-node-ident-b", other))
    assert "may write only hcs-node-ident-a, not hcs-node-ident-b" in message
    refused(lambda: b.patch(f"{NODES}/ident-a", {"spec": {"devices": []}}))
    refused(lambda: b.create(LEASES, lease("ident-c")))  # nor a node that has no syncer
    refused(lambda: b.create(NODES, compute_node("ident-c")))


def test_a_syncer_token_bound_to_no_node_writes_nothing(plane: ControlPlane) -> None:
    """A token of the account that names no node (TokenRequest without a bound object, or
    the old client certificate) is refused for every ComputeNode and Lease."""
    admin = plane.kube()
    for kube in (
        as_token(plane, "unbound", request_token(admin, "hcs-syncer")),
        plane.kube("syncer"),  # the client certificate the tests used before: no node
    ):
        message = refused(lambda k=kube: k.create(NODES, compute_node("ident-x")))
        assert "token names no node" in message
        refused(lambda k=kube: k.create(LEASES, lease("ident-x")))


def test_a_token_bound_to_a_node_works_for_a_syncer_outside_kubernetes(
    plane: ControlPlane, syncers: dict[str, Kube]
) -> None:
    """hcs-syncer.service has no pod: a token bound to the Node names the node too."""
    admin = plane.kube()
    node = admin.get("/api/v1/nodes/ident-a")
    kube = as_token(plane, "node-bound", request_token(admin, "hcs-syncer", node=node))
    kube.patch(f"{NODES}/ident-a", {"spec": {"hcsdVersion": "0.1.2"}})
    refused(lambda: kube.patch(f"{NODES}/ident-b", {"spec": {"hcsdVersion": "0.1.2"}}))


# --- the node-keys endpoint -------------------------------------------------------------


def _secret_dir(directory: Path, files: dict[str, bytes]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(directory):
        (directory / name).unlink()
    for name, value in files.items():
        (directory / name).write_bytes(value)
        (directory / name).chmod(0o400)
    return directory


@pytest.fixture(scope="module")
def endpoint(plane: ControlPlane) -> Iterator[tuple[str, Path]]:
    """The extender's node-keys endpoint over HTTPS (a serving certificate from the test CA
    for 127.0.0.1), reviewing tokens as the extender's account; (URL, the CA to trust)."""
    certs = plane.work / "certs"
    (certs / "keys-san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _sign(certs, "node-keys", "/CN=hcs-scheduler-extender", ext="keys-san.ext")
    secret = _secret_dir(
        plane.work / "secret",
        {"k1.key": K1, "k2.key": K2, "k3.key": K3, "signing": b"k2", "retired": b"k3"},
    )
    keys = NodeKeys(plane.kube("extender"), ClusterKeys(secret))
    server = serve_node_keys(keys, "127.0.0.1", 0, cert=str(certs / "node-keys.crt"),
                             key=str(certs / "node-keys.key"))  # fmt: skip
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}/node-keys", certs / "ca.crt"
    server.shutdown()


def test_each_syncer_gets_only_its_own_nodes_keys(
    plane: ControlPlane, endpoint: tuple[str, Path]
) -> None:
    url, ca = endpoint
    admin = plane.kube()
    cluster = Keyring({"k1": K1, "k2": K2}, "k2")  # k3 is retired: no node gets it
    for node in ("ident-a", "ident-b"):
        pod = syncer_pod(admin, node)
        token = request_token(admin, "hcs-syncer", pod=pod, audience="hcs-node-keys")
        answer = decode(fetch(url, token, ca=str(ca)))
        assert answer == derive(cluster, node)
        assert answer.node == node and answer.signing == "k2"
        assert set(answer.keys.values()).isdisjoint({K1, K2, K3})  # never the cluster keys


@pytest.mark.parametrize(
    ("who", "status", "message"),
    [
        pytest.param("other-account", 403, "node keys go to hcs-syncer only", id="other-sa"),
        pytest.param("unbound", 403, "bound to no node", id="unbound"),
        pytest.param("api-audience", 401, "not valid for audience hcs-node-keys", id="audience"),
        pytest.param("garbage", 401, "not valid for audience", id="not-a-token"),
    ],
)
def test_the_node_keys_endpoint_refuses_everyone_else(
    plane: ControlPlane, endpoint: tuple[str, Path], who: str, status: int, message: str
) -> None:
    url, ca = endpoint
    admin = plane.kube()
    pod = syncer_pod(admin, "ident-a")
    tokens = {
        "other-account": lambda: request_token(
            admin,
            "hcs-scheduler-extender",
            pod=syncer_pod(admin, "ident-a", "hcs-scheduler-extender"),
            audience="hcs-node-keys",
        ),
        "unbound": lambda: request_token(admin, "hcs-syncer", audience="hcs-node-keys"),
        "api-audience": lambda: request_token(admin, "hcs-syncer", pod=pod),
        "garbage": lambda: "not-a-token",
    }
    with pytest.raises(KeyFetchError, match=f"{status} .*{message}"):
        fetch(url, tokens[who](), ca=str(ca))


def test_the_endpoint_is_not_trusted_without_its_ca(endpoint: tuple[str, Path]) -> None:
    with pytest.raises(KeyFetchError, match="CERTIFICATE_VERIFY_FAILED"):
        fetch(endpoint[0], "any")


# --- the socket mount -------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root")
def test_connect_works_through_a_read_only_bind_mount(tmp_path: Path) -> None:
    """The DaemonSet mounts the API socket's directory read-only: connect() needs write
    permission on the socket file, not a writable mount. A private mount namespace, so the
    host's mounts are untouched."""
    directory = tmp_path / "api"
    directory.mkdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(directory / "hcsd.sock"))
    listener.listen(1)
    seen = tmp_path / "seen"
    script = (
        f"mkdir -p {tmp_path}/ro && mount --bind {directory} {tmp_path}/ro && "
        f"mount -o remount,bind,ro {tmp_path}/ro && "
        f"! touch {tmp_path}/ro/probe 2>/dev/null && "
        f"python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); "
        f's.connect("{tmp_path}/ro/hcsd.sock"); s.sendall(b"hi")\' && touch {seen}'
    )
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    connection, _ = listener.accept()
    assert connection.recv(2) == b"hi"
    assert done.returncode == 0 and seen.exists(), done.stderr
    connection.close()
    listener.close()
