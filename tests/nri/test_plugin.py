"""The NRI plugin end to end over a socketpair, against a runtime peer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import stat
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from hcsd.contract.assignment import sign
from hcsd.discovery import Inventory
from hcsd.model import Allocation, FrontEnd, Grant, NodeMode, PodRef
from hcsd.runtime.nri.plugin import NriPlugin
from hcsd.runtime.nri.ttrpc import Code, TtrpcError
from hcsd.runtime.nri.v1alpha1 import api_pb2 as api
from hcsd.service import NodeService
from hcsd.telemetry import Telemetry
from tests.harness.local import DiskFull, local_node
from tests.harness.umasks import umasks_seen
from tests.nri.peer import RuntimePeer

KEY = b"test-cluster-key-0123456789abcdef"
A100_0 = "GPU-5b2f0c0e-8d1a-4c11-9d2e-a100a100a000"
GiB = 2**30


@dataclass
class Setup:
    peer: RuntimePeer
    plugin: NriPlugin
    service: NodeService
    run_dir: Path
    session: asyncio.Task[None]


async def connect(plugin: NriPlugin) -> tuple[RuntimePeer, asyncio.Task[None]]:
    """A runtime session with the plugin over a socketpair, registered."""
    ours, theirs = socket.socketpair()
    plugin_streams = await asyncio.open_unix_connection(sock=ours)
    peer = RuntimePeer(*await asyncio.open_unix_connection(sock=theirs))
    session = asyncio.create_task(plugin.session(*plugin_streams))
    await asyncio.wait_for(peer.registered.wait(), 2)
    return peer, session


@contextlib.asynccontextmanager
async def plugin_setup(
    tmp_path: Path,
    inventory: Inventory,
    *,
    disk: DiskFull | None = None,
    clock: Callable[[], float] = time.perf_counter,
    mode: NodeMode = NodeMode.STANDALONE,
    now: Callable[[], float] = time.time,
    telemetry: Telemetry | None = None,
) -> AsyncIterator[Setup]:
    """`clock`: the plugin's (request timing); `now`: the injector's (assignments' age)."""
    node = local_node(tmp_path, inventory, disk=disk)
    node.ledger.allocate(
        Allocation("gone-container", (Grant(A100_0, GiB),), source="local", front_end=FrontEnd.NRI)
    )
    injector = node.injector(assignment_key=KEY, mode=mode, clock=now)
    plugin = NriPlugin(injector, clock=clock, telemetry=telemetry)
    peer, session = await connect(plugin)
    yield Setup(peer, plugin, node.service, node.run_dir, session)
    peer.close()
    await asyncio.wait_for(session, 2)
    node.close()


def container_request(
    cid: str,
    *,
    annotations: dict[str, str] | None = None,
    pod_annotations: dict[str, str] | None = None,
    uid: str = "pod-uid-1",
    **container: object,
) -> api.ContainerRequest:
    """A CreateContainer request; `container` adds fields of the Container (user, linux)."""
    return api.ContainerRequest(
        pod=api.PodSandbox(
            id="sandbox-1" if uid else "",
            name="trainer" if uid else "",
            namespace="team-a" if uid else "",
            uid=uid,
            annotations=pod_annotations or {},
        ),
        container=api.Container(id=cid, name="main", annotations=annotations or {}, **container),
    )


async def test_registration_configure_and_event_mask(nri: Setup) -> None:
    assert nri.peer.registration is not None
    assert (nri.peer.registration.plugin_name, nri.peer.registration.plugin_idx) == ("hcsd", "10")
    for version in ("v0.8.0", "", "v0.12.0"):
        reply = await nri.peer.call(
            "Configure",
            api.ConfigureRequest(
                runtime_name="containerd",
                runtime_version="2.3.4",
                NRI_version=version,
                request_timeout=2000,
            ),
            api.ConfigureResponse,
        )
        # pod sandbox run and remove (the first container's age), container create, stop, remove
        assert reply.events == (1 << 0) | (1 << 2) | (1 << 3) | (1 << 9) | (1 << 10)
        assert reply.events & ~0x7FF == 0


async def test_synchronize_in_chunks_reconciles_the_ledger(nri: Setup) -> None:
    first = await nri.peer.call(
        "Synchronize",
        api.SynchronizeRequest(
            containers=[api.Container(id="alive", state=api.CONTAINER_RUNNING)], more=True
        ),
        api.SynchronizeResponse,
    )
    assert first.more and nri.service.allocation("gone-container") is not None
    last = await nri.peer.call(
        "Synchronize", api.SynchronizeRequest(more=False), api.SynchronizeResponse
    )
    assert not last.more and not last.update
    assert nri.service.allocation("gone-container") is None


async def test_local_annotation_gets_devices_env_mounts_and_quota(nri: Setup) -> None:
    reply = await nri.peer.call(
        "CreateContainer",
        container_request("c1", annotations={"hcs.io/vram": "8Gi", "hcs.io/vendors": "nvidia"}),
        api.CreateContainerResponse,
    )
    adjust = reply.adjust
    devices = {d.path: (d.type, d.major, d.minor) for d in adjust.linux.devices}
    assert devices["/dev/nvidia0"] == ("c", 195, 0) and "/dev/nvidiactl" in devices
    assert "/dev/nvidia1" not in devices
    env = {kv.key: kv.value for kv in adjust.env}
    assert env["CUDA_VISIBLE_DEVICES"] == A100_0 and env["HCS_CONFIG"] == "/run/hcs/quota.conf"
    mounts = {m.destination: (m.source, list(m.options)) for m in adjust.mounts}
    assert mounts["/etc/ld.so.preload"][1][:2] == ["bind", "ro"]
    directory = nri.run_dir / "containers" / "c1"
    # Single files, never the directory: the quota read-only, the usage region read-write.
    assert "/run/hcs" not in mounts
    assert mounts["/run/hcs/quota.conf"] == (
        str(directory / "quota.conf"),
        ["bind", "ro", "nosuid", "nodev"],
    )
    assert mounts["/run/hcs/usage.shm"] == (
        str(directory / "usage.shm"),
        ["bind", "rw", "nosuid", "nodev"],
    )
    assert mounts["/usr/lib/hcs/libhcs.so"][1][1] == "ro"
    quota = (directory / "quota.conf").read_text()
    assert "device.0.vram_limit=8589934592" in quota and f"device.0.uuid={A100_0}" in quota
    held = nri.service.allocation("c1")
    assert held is not None and held.pod == PodRef("team-a", "trainer", "pod-uid-1")
    # stop releases the memory and removes the directory at once (kubelet removes a dead
    # container only at its next GC); a second stop and the late removal find nothing to do
    await nri.peer.call("StopContainer", container_request("c1"), api.StopContainerResponse)
    assert nri.service.allocation("c1") is None
    assert not directory.exists()
    await nri.peer.call("StopContainer", container_request("c1"), api.StopContainerResponse)
    await nri.peer.call("RemoveContainer", container_request("c1"), api.Empty)
    await nri.peer.call(
        "StateChange",
        api.StateChangeEvent(event=api.REMOVE_CONTAINER, container=api.Container(id="c1")),
        api.Empty,
    )
    assert not directory.exists() and nri.service.allocation("c1") is None


async def test_containers_without_requests_are_left_alone(nri: Setup) -> None:
    reply = await nri.peer.call(
        "CreateContainer", container_request("plain"), api.CreateContainerResponse
    )
    assert reply == api.CreateContainerResponse()


async def test_hook_times_and_registration_for_the_metrics(
    tmp_path: Path, mixed_inventory: Inventory
) -> None:
    telemetry = Telemetry()
    async with plugin_setup(tmp_path, mixed_inventory, telemetry=telemetry) as nri:
        await asyncio.wait_for(nri.plugin.connected.wait(), 2)  # the registration answered
        assert telemetry.nri_registered is True
        for _ in range(3):
            await nri.peer.call(
                "CreateContainer", container_request("plain"), api.CreateContainerResponse
            )
        count = "hcs_nri_hook_duration_seconds_count"
        samples = {
            (s.name, s.labels.get("hook")): s.value
            for family in telemetry.collect()
            for s in family.samples
        }
        assert samples[count, "CreateContainer"] == 3
        assert samples[count, "Synchronize"] == 0  # every hook's series from the start
    assert telemetry.nri_registered is False  # the runtime went away


async def test_registered_while_any_of_two_sessions_is(
    tmp_path: Path, mixed_inventory: Inventory
) -> None:
    """hcsd's own connection and the pre-launched relay's run side by side: one ending
    leaves hcsd registered through the other."""
    telemetry = Telemetry()
    async with plugin_setup(tmp_path, mixed_inventory, telemetry=telemetry) as nri:
        await asyncio.wait_for(nri.plugin.connected.wait(), 2)
        peer, session = await connect(nri.plugin)  # the second session, registered
        peer.close()
        await asyncio.wait_for(session, 2)  # ... and gone again
        assert telemetry.nri_registered is True
        exported = [s for f in telemetry.collect() for s in f.samples]
        assert [s.value for s in exported if s.name == "hcs_nri_registered"] == [1]
    assert telemetry.nri_registered is False  # both gone


def assignment(**overrides: object) -> str:
    body: dict[str, object] = {
        "v": 1,
        "node": "sim",
        "pod_uid": "pod-uid-1",
        "issued": time.time(),
        "containers": {"main": [{"uuid": A100_0, "vram": 16 * GiB, "compute": 25}]},
    }
    body.update(overrides)
    return sign(body, KEY)


async def test_signed_assignment_is_honoured(nri: Setup) -> None:
    await nri.peer.call(
        "CreateContainer",
        container_request("c2", pod_annotations={"hcs.io/assignment": assignment()}),
        api.CreateContainerResponse,
    )
    held = nri.service.allocation("c2")
    assert held is not None and held.source == "assignment"
    assert held.grants == (Grant(A100_0, 16 * GiB, 25),)


def forged() -> str:
    value = json.loads(assignment())
    value["containers"]["main"][0]["vram"] = 80 * GiB
    return json.dumps(value)


def non_ascii_signature() -> str:
    value = json.loads(assignment())
    value["sig"] = "\u00e9" * 64
    return json.dumps(value)


def sandbox(event: int, uid: str) -> api.StateChangeEvent:
    return api.StateChangeEvent(
        event=event, pod=api.PodSandbox(id=f"sandbox-{uid}", name="trainer", uid=uid)
    )


async def test_the_first_containers_age_is_taken_when_its_pod_sandbox_started(
    tmp_path: Path, mixed_inventory: Inventory
) -> None:
    """An hour of image pulls between the sandbox and the first container refuses nothing;
    a pod whose sandbox start hcsd did not see is aged at the first container, as before."""
    now = [time.time()]
    async with plugin_setup(tmp_path, mixed_inventory, now=lambda: now[0]) as nri:
        issued = now[0]
        await nri.peer.call("StateChange", sandbox(api.RUN_POD_SANDBOX, "pod-uid-1"), api.Empty)
        now[0] += 3600
        await nri.peer.call("StateChange", sandbox(api.RUN_POD_SANDBOX, "pod-uid-1"), api.Empty)
        late = assignment(issued=issued)
        await nri.peer.call(
            "CreateContainer",
            container_request("c1", pod_annotations={"hcs.io/assignment": late}),
            api.CreateContainerResponse,
        )
        assert nri.service.allocation("c1") is not None
        unseen = assignment(issued=issued, pod_uid="pod-uid-2")
        with pytest.raises(TtrpcError, match="is stale: issued 3600s ago"):
            await nri.peer.call(
                "CreateContainer",
                container_request(
                    "c2", pod_annotations={"hcs.io/assignment": unseen}, uid="pod-uid-2"
                ),
                api.CreateContainerResponse,
            )
        # The sandbox started an hour after the assignment: the window is still short.
        await nri.peer.call("StateChange", sandbox(api.RUN_POD_SANDBOX, "pod-uid-2"), api.Empty)
        with pytest.raises(TtrpcError, match="is stale"):
            await nri.peer.call(
                "CreateContainer",
                container_request(
                    "c2", pod_annotations={"hcs.io/assignment": unseen}, uid="pod-uid-2"
                ),
                api.CreateContainerResponse,
            )
        # A removed sandbox is forgotten: a pod uid seen again is aged afresh.
        await nri.peer.call("StateChange", sandbox(api.REMOVE_POD_SANDBOX, "pod-uid-1"), api.Empty)
        assert "pod-uid-1" not in nri.plugin.injector.acceptances._sandboxes


@pytest.mark.parametrize(
    ("pod_annotations", "annotations", "uid", "code", "message"),
    [
        pytest.param(
            {"hcs.io/assignment": forged()},
            {},
            "pod-uid-1",
            Code.INVALID_ARGUMENT,
            "signature does not verify",
            id="forged",
        ),
        pytest.param(
            {"hcs.io/assignment": assignment(issued=time.time() - 30 * 86400)},
            {},
            "pod-uid-1",
            Code.INVALID_ARGUMENT,
            "is stale",
            id="stale",
        ),
        pytest.param(
            {"hcs.io/assignment": assignment()},
            {},
            "other-pod",
            Code.INVALID_ARGUMENT,
            "not other-pod",
            id="replayed-on-another-pod",
        ),
        pytest.param(
            {"hcs.io/assignment": assignment(node="node-9")},
            {},
            "pod-uid-1",
            Code.INVALID_ARGUMENT,
            "for node node-9",
            id="other-node",
        ),
        pytest.param(
            {"hcs.io/assignment": non_ascii_signature()},
            {},
            "pod-uid-1",
            Code.INVALID_ARGUMENT,
            "signature is not 64 lower-case hex digits",
            id="non-ascii-signature",
        ),
        pytest.param(
            {"hcs.io/assignment": "[" * 50_000},
            {},
            "pod-uid-1",
            Code.INVALID_ARGUMENT,
            "not JSON",
            id="nested-too-deep",
        ),
        pytest.param(
            {"hcs.io/assignment": "{not json"},
            {},
            "pod-uid-1",
            Code.INVALID_ARGUMENT,
            "not JSON",
            id="garbage",
        ),
        pytest.param(
            {},
            {"hcs.io/vram": "lots"},
            "pod-uid-1",
            Code.INVALID_ARGUMENT,
            "invalid quantity 'lots'",
            id="bad-quantity",
        ),
        pytest.param(
            {},
            {"hcs.io/vram": "1Ti"},
            "pod-uid-1",
            Code.RESOURCE_EXHAUSTED,
            "1Ti wanted",
            id="over-capacity",
        ),
        pytest.param(
            {},
            {"hcs.io/vram": "1Gi", "hcs.io/vendors": "intel"},
            "pod-uid-1",
            Code.INVALID_ARGUMENT,
            "unknown vendor",
            id="bad-vendor",
        ),
    ],
)
async def test_bad_requests_fail_container_creation_with_the_reason(
    nri: Setup,
    pod_annotations: dict[str, str],
    annotations: dict[str, str],
    uid: str,
    code: Code,
    message: str,
) -> None:
    with pytest.raises(TtrpcError) as info:
        await nri.peer.call(
            "CreateContainer",
            container_request(
                "bad", annotations=annotations, pod_annotations=pod_annotations, uid=uid
            ),
            api.CreateContainerResponse,
        )
    assert info.value.code == code
    assert message in info.value.message and info.value.message.startswith("hcsd: team-a/")
    assert nri.service.allocation("bad") is None


@pytest.mark.parametrize(
    "cid", ["c1\n", "c1\n\n", "../c1", "c1/..", ".hidden", "c" * 129], ids=repr
)
async def test_unsafe_container_ids_get_no_directory_and_hold_nothing(nri: Setup, cid: str) -> None:
    with pytest.raises(TtrpcError):
        await nri.peer.call(
            "CreateContainer",
            container_request(cid, annotations={"hcs.io/vram": "1Gi"}),
            api.CreateContainerResponse,
        )
    assert nri.service.allocation(cid) is None
    containers = nri.run_dir / "containers"
    assert not containers.exists() or list(containers.iterdir()) == []


async def test_unknown_methods_get_unimplemented(nri: Setup) -> None:
    with pytest.raises(TtrpcError) as info:
        await nri.peer.call("PostStartContainer", container_request("x"), api.Empty)
    assert info.value.code == Code.UNIMPLEMENTED


async def test_session_ends_on_eof(nri: Setup) -> None:
    nri.peer.close()
    await asyncio.wait_for(nri.session, 2)


@pytest.mark.parametrize("mode", [0o644, 0o640])
def test_an_open_key_file_refuses_assignments_with_the_fix(
    tmp_path: Path, mixed_inventory: Inventory, mode: int
) -> None:
    from hcsd.contract.keys import KeyFile
    from hcsd.refusals import Refusal
    from hcsd.runtime.injector import ContainerInfo

    key = tmp_path / "assignment.key"
    key.write_bytes(KEY)
    key.chmod(mode)
    node = local_node(tmp_path, mixed_inventory)
    key_file = KeyFile(str(key))
    injector = node.injector(keyring=lambda: {"": key_file()})
    info = ContainerInfo(
        "c10",
        "main",
        PodRef("ns", "p", "pod-uid-1"),
        pod_annotations={"hcs.io/assignment": assignment()},
    )
    with pytest.raises(Refusal, match=f"mode {mode:04o}\\): chmod 0600 {key}"):
        injector.create(info)
    key.chmod(0o600)
    assert injector.create(info) is not None  # fixed: the same pod starts
    node.close()


async def test_prelaunch_socket_is_0600_and_the_umask_never_changes_under_other_tasks(
    nri: Setup, tmp_path: Path
) -> None:
    """Other tasks keep creating files while the socket is set up: they see the usual umask."""
    path = tmp_path / "prelaunch" / "nri-prelaunch.sock"
    nri.plugin.prelaunch_socket = str(path)
    async with umasks_seen() as seen:
        serving = asyncio.create_task(nri.plugin.serve_prelaunched())
        try:
            for _ in range(200):
                await asyncio.sleep(0)
                if path.exists():
                    break
            mode = path.lstat().st_mode
            assert stat.S_IMODE(mode) == 0o600 and stat.S_ISSOCK(mode)
            _, writer = await asyncio.open_unix_connection(str(path))  # it serves
            writer.close()
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
    assert seen == {0o022}
