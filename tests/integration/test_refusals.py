"""One refusal, the same everywhere: each front end over its real transport.

A full disk while the ledger writes, a request past the node's room, and a malformed
annotation, through the gRPC API (a real channel), the NRI plugin (ttrpc over a socketpair)
and the runc wrapper and OCI hook (subprocesses against the API socket). Each front end must
give the table's status code (where its transport has one), the reason, whether a retry may
succeed, and the figures; the refusal is counted once and nothing stays allocated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from hcsd.api.server import ApiServer
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.api.v1 import hcsd_pb2_grpc as pb_grpc
from hcsd.discovery import Inventory
from hcsd.model import Request
from hcsd.refusals import METADATA_KEY, Code, Reason
from hcsd.runtime.injector import Injector
from hcsd.runtime.nri.plugin import NriPlugin
from hcsd.runtime.nri.ttrpc import TtrpcError
from hcsd.runtime.nri.v1alpha1 import api_pb2 as api
from hcsd.service import NodeService
from tests.conftest import GiB
from tests.harness.bundles import BIN
from tests.harness.local import DiskFull, local_node
from tests.nri.peer import RuntimePeer


@dataclass
class Node:
    service: NodeService
    injector: Injector
    fs: DiskFull
    socket: str
    root: Path


@dataclass(frozen=True)
class Case:
    vram: str  # the `hcs.io/vram` annotation (or AllocateRequest.vram)
    disk_full: bool
    code: Code
    reason: Reason
    figures: str


CASES = {
    "full-disk": Case("8Gi", True, Code.UNAVAILABLE, Reason.WRITE_FAILED, "No space left"),
    "over-quota": Case(
        "1Ti",
        False,
        Code.RESOURCE_EXHAUSTED,
        Reason.INSUFFICIENT_VRAM,
        "1Ti wanted, most free is 80Gi",
    ),
    "malformed-annotation": Case(
        "lots", False, Code.INVALID_ARGUMENT, Reason.INVALID_REQUEST, "invalid quantity 'lots'"
    ),
}


@dataclass
class Outcome:
    """What the caller of a front end got: a status code where the transport has one, and
    the text it shows (with the reason and, where temporary, the retry hint)."""

    code: int | None
    text: str
    reason: str = ""


@pytest.fixture
async def node(tmp_path: Path, mixed_inventory: Inventory) -> AsyncIterator[Node]:
    local = local_node(tmp_path, mixed_inventory)
    injector = local.injector()
    socket_path = str(tmp_path / "hcsd.sock")
    server = ApiServer(local.service, socket_path, injector)
    await server.start()
    yield Node(local.service, injector, local.disk, socket_path, tmp_path)
    await server.stop(0.5)
    local.close()


async def through_allocate(node: Node, case: Case) -> Outcome:
    async with grpc.aio.insecure_channel(f"unix:{node.socket}") as channel:
        stub = pb_grpc.HcsdStub(channel)
        try:
            await stub.Allocate(pb.AllocateRequest(container_id="job", vram=case.vram))
        except grpc.aio.AioRpcError as e:
            return _grpc_outcome(e)
    raise AssertionError("Allocate succeeded")


async def through_prepare(node: Node, case: Case) -> Outcome:
    async with grpc.aio.insecure_channel(f"unix:{node.socket}") as channel:
        stub = pb_grpc.HcsdStub(channel)
        request = pb.PrepareContainerRequest(
            container_id="job",
            container_name="main",
            pod=pb.PodRef(namespace="team-a", name="trainer", uid="u1"),
            container_annotations={"hcs.io/vram": case.vram},
        )
        try:
            await stub.PrepareContainer(request)
        except grpc.aio.AioRpcError as e:
            return _grpc_outcome(e)
    raise AssertionError("PrepareContainer succeeded")


def _grpc_outcome(error: grpc.aio.AioRpcError) -> Outcome:
    reasons = [v for k, v in error.trailing_metadata() or () if k == METADATA_KEY]
    assert len(reasons) == 1 and isinstance(reasons[0], str), reasons
    return Outcome(error.code().value[0], error.details() or "", reasons[0])


@contextlib.asynccontextmanager
async def runtime_peer(node: Node) -> AsyncIterator[RuntimePeer]:
    """The runtime's end of an NRI connection to hcsd's plugin, registered."""
    plugin = NriPlugin(node.injector)
    ours, theirs = socket.socketpair()
    session = asyncio.create_task(plugin.session(*await asyncio.open_unix_connection(sock=ours)))
    peer = RuntimePeer(*await asyncio.open_unix_connection(sock=theirs))
    try:
        await asyncio.wait_for(peer.registered.wait(), 2)
        yield peer
    finally:
        peer.close()
        await asyncio.wait_for(session, 2)


async def through_nri(node: Node, case: Case) -> Outcome:
    request = api.ContainerRequest(
        pod=api.PodSandbox(id="sandbox", name="trainer", namespace="team-a", uid="u1"),
        container=api.Container(id="job", name="main", annotations={"hcs.io/vram": case.vram}),
    )
    async with runtime_peer(node) as peer:
        try:
            await peer.call("CreateContainer", request, api.CreateContainerResponse)
        except TtrpcError as e:
            return Outcome(e.code, e.message)
    raise AssertionError("CreateContainer succeeded")


def _bundle(node: Node, case: Case) -> Path:
    bundle = node.root / "bundle"
    bundle.mkdir(exist_ok=True)
    config = {"ociVersion": "1.0.2", "annotations": {"hcs.io/vram": case.vram}}
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


async def _run(argv: list[str], node: Node, stdin: bytes = b"") -> tuple[int, str]:
    env = dict(os.environ, HCS_SOCKET=node.socket, HCS_RUNC="/bin/false")
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    _, err = await asyncio.wait_for(process.communicate(stdin), 60)
    assert process.returncode is not None
    return process.returncode, err.decode()


async def through_runc_wrapper(node: Node, case: Case) -> Outcome:
    bundle = _bundle(node, case)
    code, err = await _run(
        [str(BIN / "hcs-runtime"), "create", "--bundle", str(bundle), "job"], node
    )
    assert code == 1 and err.startswith("hcs-runtime: job: ") and err.count("\n") == 1, err
    return Outcome(None, err)


async def through_oci_hook(node: Node, case: Case) -> Outcome:
    state = {
        "ociVersion": "1.0.2",
        "id": "job",
        "status": "creating",
        "bundle": str(_bundle(node, case)),
    }
    code, err = await _run(
        [str(BIN / "hcs-oci-hook"), "createRuntime"], node, json.dumps(state).encode()
    )
    assert code == 1 and err.startswith("hcs-oci-hook: job: ") and err.count("\n") == 1, err
    return Outcome(None, err)


FRONT_ENDS: dict[str, Callable[[Node, Case], Awaitable[Outcome]]] = {
    "api-allocate": through_allocate,
    "api-prepare": through_prepare,
    "nri": through_nri,
    "runc-wrapper": through_runc_wrapper,
    "oci-hook": through_oci_hook,
}


@pytest.mark.parametrize("case_name", list(CASES))
@pytest.mark.parametrize("front_end", list(FRONT_ENDS))
async def test_a_refusal_reads_the_same_through_every_front_end(
    node: Node, front_end: str, case_name: str
) -> None:
    case = CASES[case_name]
    node.fs.full = case.disk_full
    outcome = await FRONT_ENDS[front_end](node, case)
    if outcome.code is not None:
        assert outcome.code == case.code
    assert case.figures in outcome.text
    if front_end.startswith("api-"):
        assert outcome.reason == case.reason.value  # a machine-readable reason for clients
    else:
        hint = "; temporary, retry" if case.disk_full else ""
        assert f"(refused: {case.reason.value}{hint})" in outcome.text
    assert node.service.refusal_counts() == {case.reason: 1}
    assert node.service.allocations() == []
    if case.disk_full:  # temporary indeed: with room on the disk again, the same request fits
        node.fs.full = False
        assert node.service.allocate(Request("job", vram_bytes=8 * GiB))[1]


async def test_releasing_on_a_full_disk_is_temporary_through_every_front_end(node: Node) -> None:
    """Stop and remove release memory: a failed ledger write there is the same refusal."""
    node.service.allocate(Request("held", vram_bytes=GiB, source="local"))
    node.fs.full = True
    async with grpc.aio.insecure_channel(f"unix:{node.socket}") as channel:
        stub = pb_grpc.HcsdStub(channel)
        for call in (
            stub.Release(pb.ReleaseRequest(container_id="held")),
            stub.ContainerGone(pb.ContainerGoneRequest(container_id="held", deleted=True)),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            outcome = _grpc_outcome(refused.value)
            assert (outcome.code, outcome.reason) == (Code.UNAVAILABLE, "write_failed")
    async with runtime_peer(node) as peer:
        stop = api.ContainerRequest(container=api.Container(id="held"))
        with pytest.raises(TtrpcError) as failed:
            await peer.call("StopContainer", stop, api.StopContainerResponse)
    assert failed.value.code == Code.UNAVAILABLE
    assert failed.value.message.endswith("(refused: write_failed; temporary, retry)")
    assert node.service.allocation("held") is not None
    assert node.service.refusal_counts() == {Reason.WRITE_FAILED: 3}
