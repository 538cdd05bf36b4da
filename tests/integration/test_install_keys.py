"""InstallKeys over the real API socket: hcs-syncer hands hcsd its node's keys, hcsd stores
them 0600 and verifies the next assignment with them; another node's keys are refused."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest

from hcsd.api.server import ApiServer
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.api.v1 import hcsd_pb2_grpc as pb_grpc
from hcsd.cluster.binding import signed_assignment
from hcsd.contract.assignment import ANNOTATION
from hcsd.contract.keyring import Keyring, derive, encode
from hcsd.contract.keyring_files import KeyringFile
from hcsd.discovery import Inventory
from hcsd.model import Grant, PodRef
from hcsd.runtime.injector import ContainerInfo, Injector
from hcsd.runtime.settings import RuntimeSection
from tests.conftest import GiB
from tests.harness.local import NODE_NAME, local_node

CLUSTER = Keyring({"k1": b"cluster-key-one-0123456789abcdef-0123456789"}, "k1")
A100_0 = "GPU-5b2f0c0e-8d1a-4c11-9d2e-a100a100a000"


@dataclass
class Node:
    stub: pb_grpc.HcsdStub
    injector: Injector
    keyring: Path


@pytest.fixture
async def node(tmp_path: Path, mixed_inventory: Inventory) -> AsyncIterator[Node]:
    local = local_node(tmp_path, mixed_inventory)
    keyring = tmp_path / "state" / "keyring.json"
    injector = local.injector(keyring=KeyringFile(str(keyring), NODE_NAME))
    runtime = replace(injector.settings.runtime, assignment_keyring_file=str(keyring))
    injector.settings = replace(injector.settings, runtime=runtime)
    server = ApiServer(local.service, str(tmp_path / "api" / "hcsd.sock"), injector)
    await server.start()
    async with grpc.aio.insecure_channel(f"unix:{tmp_path}/api/hcsd.sock") as channel:
        yield Node(pb_grpc.HcsdStub(channel), injector, keyring)
    await server.stop(0.5)
    local.close()


async def test_installed_keys_are_stored_0600_and_verify_the_next_assignment(node: Node) -> None:
    old = os.umask(0)  # whatever the umask, the file is 0600
    try:
        answer = await node.stub.InstallKeys(
            pb.InstallKeysRequest(keyring=encode(derive(CLUSTER, NODE_NAME)))
        )
    finally:
        os.umask(old)
    assert (answer.changed, list(answer.key_ids), answer.signing) == (True, ["k1"], "k1")
    assert node.keyring.stat().st_mode & 0o777 == 0o600
    again = await node.stub.InstallKeys(
        pb.InstallKeysRequest(keyring=encode(derive(CLUSTER, NODE_NAME)))
    )
    assert again.changed is False
    pod = PodRef("ns", "p", "uid-1")
    text = signed_assignment(
        NODE_NAME, pod.uid, {"main": (Grant(A100_0, GiB),)}, CLUSTER, node.injector.clock()
    )
    info = ContainerInfo("c1", "main", pod, {}, {ANNOTATION: text})
    assert node.injector.create(info) is not None


@pytest.mark.parametrize(
    ("keyring", "message"),
    [
        pytest.param(encode(derive(CLUSTER, "other-node")), "node 'other-node'", id="other-node"),
        pytest.param('{"node": "sim", "keys": {"k1": "c2hvcnQ="}}', "5 bytes", id="short-key"),
        pytest.param("{", "not JSON", id="not-json"),
        pytest.param(
            encode(Keyring({f"k{i}": bytes([i]) * 400 for i in range(200)}, "k1", NODE_NAME)),
            "more than the 65536 hcsd reads",
            id="larger-than-hcsd-reads",
        ),
    ],
)
async def test_keys_that_are_not_this_nodes_are_refused(
    node: Node, keyring: str, message: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await node.stub.InstallKeys(pb.InstallKeysRequest(keyring=keyring))
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert message in (e.value.details() or "")
    assert not node.keyring.exists()


def test_the_default_keyring_is_root_state_not_configuration() -> None:
    """hcsd's unit may write its state directory (StateDirectory), not /etc (ProtectSystem);
    a test's hcsd, with a state directory of its own, never touches the host's keyring."""
    assert RuntimeSection().keyring_path("/var/lib/hcsd") == "/var/lib/hcsd/keyring.json"
    assert RuntimeSection().keyring_path("/tmp/t/state") == "/tmp/t/state/keyring.json"
    assert RuntimeSection(assignment_keyring_file="/k.json").keyring_path("/x") == "/k.json"
