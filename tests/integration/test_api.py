"""The local API over its real unix socket: calls, bad input, socket permissions."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from hcsd.api.server import ApiServer, SocketInUse
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.api.v1 import hcsd_pb2_grpc as pb_grpc
from hcsd.discovery import Inventory
from hcsd.model import Allocation, Grant, PodRef, VramViolation
from hcsd.service import NodeService
from tests.harness.local import local_node
from tests.harness.umasks import umasks_seen

NOBODY = 65534


@dataclass
class Api:
    socket: str
    stub: pb_grpc.HcsdStub
    channel: grpc.aio.Channel
    service: NodeService


@pytest.fixture
async def api(tmp_path: Path, mixed_inventory: Inventory) -> AsyncIterator[Api]:
    node = local_node(tmp_path, mixed_inventory)
    socket_path = str(tmp_path / "run" / "hcsd.sock")
    server = ApiServer(node.service, socket_path)
    await server.start()
    channel = grpc.aio.insecure_channel(f"unix:{socket_path}")
    yield Api(socket_path, pb_grpc.HcsdStub(channel), channel, node.service)
    await channel.close()
    await server.stop(0.5)
    node.close()


async def test_devices_and_node(api: Api) -> None:
    devices = (await api.stub.ListDevices(pb.ListDevicesRequest())).devices
    assert len(devices) == 6
    assert {d.vendor for d in devices} == {"nvidia", "ascend", "hygon", "cambricon"}
    node = await api.stub.GetNode(pb.GetNodeRequest())
    assert node.device_count == 6 and list(node.backends) == ["simulated"]


async def test_allocate_release_round_trip(api: Api) -> None:
    request = pb.AllocateRequest(
        container_id="c1",
        vram="16Gi",
        vendors=["nvidia"],
        pod=pb.PodRef(namespace="ns", name="p", uid="u"),
    )
    response = await api.stub.Allocate(request)
    assert response.created and response.model == "A100-SXM4-80GB"
    assert response.allocation.grants[0].vram_bytes == 16 * 2**30
    again = await api.stub.Allocate(request)
    assert not again.created and again.allocation == response.allocation
    listed = (await api.stub.ListAllocations(pb.ListAllocationsRequest())).allocations
    assert [a.container_id for a in listed] == ["c1"]
    released = await api.stub.Release(pb.ReleaseRequest(container_id="c1"))
    assert released.released and released.allocation.container_id == "c1"
    assert not (await api.stub.Release(pb.ReleaseRequest(container_id="c1"))).released


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        pytest.param(
            pb.AllocateRequest(container_id="c", vram="16GB"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "invalid quantity '16GB'",
            id="vram",
        ),
        pytest.param(
            pb.AllocateRequest(container_id="", vram="1Gi"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "container id must not be empty",
            id="no-id",
        ),
        pytest.param(
            pb.AllocateRequest(container_id="c", vendors=["intel"]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "unknown vendor 'intel'",
            id="vendor",
        ),
        pytest.param(
            pb.AllocateRequest(container_id="c", policy="random"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "policy must be one of",
            id="policy",
        ),
        pytest.param(
            pb.AllocateRequest(container_id="c", compute_percent=300),
            grpc.StatusCode.INVALID_ARGUMENT,
            "0..100",
            id="compute",
        ),
        pytest.param(
            pb.AllocateRequest(container_id="c", tflops_fp16="-5"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "tflops-fp16 must be positive",
            id="tflops",
        ),
        pytest.param(
            pb.AllocateRequest(container_id="c", vram="1Ti"),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "1Ti wanted",
            id="too-big",
        ),
    ],
)
async def test_bad_requests_get_a_clear_status(
    api: Api, request_: pb.AllocateRequest, code: grpc.StatusCode, message: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await api.stub.Allocate(request_)
    assert info.value.code() == code
    assert message in (info.value.details() or "")
    assert api.service.seq == 0


async def test_conflicting_repeat_is_already_exists(api: Api) -> None:
    await api.stub.Allocate(pb.AllocateRequest(container_id="c", vram="1Gi"))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await api.stub.Allocate(pb.AllocateRequest(container_id="c", vram="2Gi"))
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_undecodable_bytes_are_refused_and_the_server_lives_on(api: Api) -> None:
    raw = api.channel.unary_unary(
        "/hcsd.v1.Hcsd/Allocate",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await raw(b"\xff\xff\xff\xff\x0f garbage that is not protobuf")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed AllocateRequest" in (info.value.details() or "")
    unknown = api.channel.unary_unary(
        "/hcsd.v1.Hcsd/Nope", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await unknown(b"")
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert len((await api.stub.ListDevices(pb.ListDevicesRequest())).devices) == 6


async def test_watch_streams_initial_state_and_changes(api: Api) -> None:
    stream = api.stub.Watch(pb.WatchRequest(send_initial=True))
    kinds = []
    async for event in stream:
        kinds.append(event.kind)
        if event.kind == pb.Event.KIND_SYNCED:
            await api.stub.Allocate(pb.AllocateRequest(container_id="w", vram="1Gi"))
        if event.kind == pb.Event.KIND_ALLOCATED:
            assert event.allocation.container_id == "w" and event.seq == 1
            break
    stream.cancel()
    assert kinds[:6] == [pb.Event.KIND_INITIAL] * 6
    assert kinds[6:] == [pb.Event.KIND_SYNCED, pb.Event.KIND_ALLOCATED]


async def test_watch_carries_the_vram_watchdog_findings(api: Api) -> None:
    stream = api.stub.Watch(pb.WatchRequest(send_initial=False))
    first = asyncio.ensure_future(stream.read())
    while api.service.watcher_count == 0:  # the server has subscribed this watcher
        await asyncio.sleep(0.01)
    api.service.report_violation(
        VramViolation(
            container_id="c" * 64,
            device_uuid="GPU-1",
            used_bytes=9 * 2**30,
            granted_bytes=4 * 2**30,
            allowed_bytes=5 * 2**30,
            accounted_bytes=3 * 2**30,
            pids=(101, 102),
            action="killed",
            pod=PodRef("team-a", "trainer", "uid-1"),
            container_name="main",
        )
    )
    event = await asyncio.wait_for(first, 5)
    stream.cancel()
    assert event.kind == pb.Event.KIND_VRAM_OVER_QUOTA
    found = event.violation
    assert (found.container_id, found.device_uuid, found.action) == ("c" * 64, "GPU-1", "killed")
    assert (found.used_bytes, found.granted_bytes, found.accounted_bytes) == (
        9 * 2**30,
        4 * 2**30,
        3 * 2**30,
    )
    assert list(found.pids) == [101, 102] and found.pod.name == "trainer"


async def test_socket_is_root_only(api: Api) -> None:
    mode = stat.S_IMODE(os.stat(api.socket).st_mode)
    assert mode == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to an unprivileged user")
async def test_unprivileged_user_cannot_connect(api: Api) -> None:
    # Every directory on the way is opened to others, so that the socket's own mode is what
    # stops the unprivileged process.
    path = Path(api.socket).parent
    while path != path.parent:
        os.chmod(path, os.stat(path).st_mode | 0o005)
        path = path.parent
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 2
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            probe = socket.socket(socket.AF_UNIX)
            try:
                probe.connect(api.socket)
                code = 0
            except PermissionError:
                code = 13
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 13


async def test_second_server_on_a_live_socket_is_refused(api: Api) -> None:
    other = ApiServer(api.service, api.socket)
    with pytest.raises(SocketInUse, match="already running"):
        await other.start()


async def test_stale_socket_is_replaced(tmp_path: Path, mixed_inventory: Inventory) -> None:
    import socket

    path = str(tmp_path / "stale.sock")
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(path)
    dead.close()  # the file stays, nobody listens: as after a crash
    node = local_node(tmp_path, mixed_inventory)
    server = ApiServer(node.service, path)
    await server.start()
    await server.stop(0)
    node.close()
    assert not os.path.exists(path)


async def test_the_socket_is_0600_and_the_umask_never_changes_under_other_tasks(
    tmp_path: Path, mixed_inventory: Inventory
) -> None:
    """Other tasks keep creating files while the API starts: they see the usual umask."""
    import asyncio
    import stat

    node = local_node(tmp_path, mixed_inventory)
    path = tmp_path / "api" / "hcsd.sock"
    server = ApiServer(node.service, str(path))
    async with umasks_seen() as seen:
        try:
            await asyncio.sleep(0)
            await server.start()
            await asyncio.sleep(0)
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
        finally:
            await server.stop(0)
            node.close()
    assert seen == {0o022}


@pytest.mark.parametrize(
    "container_id",
    [
        pytest.param("job-1\n", id="trailing-newline"),
        pytest.param("job-1\nhcsd: forged line", id="newline"),
        pytest.param("../../etc", id="path"),
        pytest.param("a" * 129, id="too-long"),
        pytest.param("x" * 256, id="at-the-old-limit"),
        pytest.param("-job", id="leading-dash"),
    ],
)
async def test_every_method_bounds_the_container_id(api: Api, container_id: str) -> None:
    """The id the runtime would refuse is refused by the API too, before it reaches the
    ledger or a log line, with INVALID_ARGUMENT and the id escaped."""
    calls = [
        api.stub.Allocate(pb.AllocateRequest(container_id=container_id, vram="1Gi")),
        api.stub.Release(pb.ReleaseRequest(container_id=container_id)),
    ]
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = info.value.details() or ""
        assert details.startswith("invalid request: container id ")
        assert "is not 1-128 characters of letters, digits" in details
        assert "\n" not in details
    assert api.service.seq == 0 and api.service.allocations() == []


async def test_an_id_held_from_before_the_check_can_still_be_released(api: Api) -> None:
    api.service.hold(Allocation("legacy id", (Grant(api.service.devices()[0].device.uuid, 1),)))
    released = await api.stub.Release(pb.ReleaseRequest(container_id="legacy id"))
    assert released.released and api.service.allocations() == []
