"""DRA mode's runtime profiles through the NRI plugin over a socketpair: a claim prepared with
the profile the kubelet plugin resolved (hcsd/runtime/claims.py, claim_runtime.py), then the
claim's container, recognised by its claim's quota-file mount, gets the profile's env and
args, checked as from an assignment: a wrong image is refused, another pod sharing the claim
gets nothing, and the pod's own annotations give nothing."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hcsd.contract.runtime_binding import load
from hcsd.discovery import Inventory
from hcsd.model import NodeMode, PodRef
from hcsd.refusals import Reason
from hcsd.runtime.claim_runtime import ClaimRuntime
from hcsd.runtime.claims import ClaimDevice, Claims
from hcsd.runtime.nri.plugin import NriPlugin
from hcsd.runtime.nri.ttrpc import Code, TtrpcError
from hcsd.runtime.nri.v1alpha1 import api_pb2 as api
from tests.harness.local import local_node
from tests.nri.test_plugin import Setup, connect, container_request
from tests.nri.test_runtime_profiles import CODE, IMAGE, IMAGE_NAME, PROFILE

GiB = 2**30
CLAIM_UID = "0b5c7e52-claim-4d2a"


@contextlib.asynccontextmanager
async def prepared(tmp_path: Path, inventory: Inventory, **profile: Any) -> AsyncIterator[Setup]:
    """The plugin (containerd 2.3, NRI v0.12) on a node where the claim holds 16Gi of
    nvidia-0 and was prepared with PROFILE (changed by `profile`) for pod-uid-1."""
    node = local_node(tmp_path, inventory)
    injector = node.injector(mode=NodeMode.CLUSTER)
    claims = Claims(
        node.service,
        str(node.run_dir),
        injector.settings.runtime.libhcs_path,
        injector.settings.runtime.driver_paths,
        str(tmp_path / "cdi"),
    )
    runtime = ClaimRuntime("pod-uid-1", load({**PROFILE, **profile}))
    device = ClaimDevice(request="r0", device="nvidia-0", memory_bytes=16 * GiB, compute_percent=0)
    claims.prepare(PodRef("team-a", "trainer-claim", CLAIM_UID), [device], runtime)
    plugin = NriPlugin(injector)
    peer, session = await connect(plugin)
    configure = api.ConfigureRequest(
        runtime_name="containerd", runtime_version="v2.3.7", NRI_version="v0.12.0"
    )
    await peer.call("Configure", configure, api.ConfigureResponse)
    yield Setup(peer, plugin, node.service, node.run_dir, session)
    peer.close()
    await session
    node.close()


def claim_container(
    run_dir: Path,
    *,
    uid: str = "pod-uid-1",
    image: dict[str, str] = IMAGE_NAME,
    pod_annotations: dict[str, str] | None = None,
    claim: bool = True,
) -> api.ContainerRequest:
    """`main` as containerd creates it after kubelet passed the claim's CDI ids: the CDI
    spec's env and its quota-file mount already in the container."""
    mounts = [CODE]
    if claim:
        source = run_dir / "claims" / f"claim-{CLAIM_UID}" / "quota.conf"
        mounts.append(api.Mount(destination="/run/hcs/quota.conf", type="bind",
                                source=str(source), options=["ro", "bind"]))  # fmt: skip
    return container_request(
        "c1",
        annotations=image,
        pod_annotations=pod_annotations,
        uid=uid,
        mounts=mounts,
        env=[
            "PATH=/usr/local/bin:/usr/bin",
            "CUDA_VISIBLE_DEVICES=GPU-from-cdi",
            "HCS_CONFIG=/run/hcs/quota.conf",
        ],
        args=["/placeholder"],
    )


@pytest.fixture
async def claim_12(tmp_path: Path, mixed_inventory: Inventory) -> AsyncIterator[Setup]:
    async with prepared(tmp_path, mixed_inventory) as setup:
        yield setup


async def create(setup: Setup, req: api.ContainerRequest) -> api.CreateContainerResponse:
    return await setup.peer.call("CreateContainer", req, api.CreateContainerResponse)


async def test_the_claims_profile_sets_env_and_argv_and_leaves_the_claims_variables(
    claim_12: Setup,
) -> None:
    reply = await create(claim_12, claim_container(claim_12.run_dir))
    assert list(reply.adjust.args) == ["python3", "-m", "serve", "--port", "8000"]
    env = {kv.key: kv.value for kv in reply.adjust.env}
    assert env["PATH"] == "/opt/profile/bin:/usr/local/bin:/usr/bin"
    assert env["NCCL_DEBUG"] == "INFO" and env["HCS_CODE_DIR"] == "/workspace"
    # the claim's CDI spec set these: the profile's values are dropped, the CDI's stay
    assert "CUDA_VISIBLE_DEVICES" not in env and "HCS_CONFIG" not in env
    assert "LD_PRELOAD" not in env
    # the devices came through CDI: the plugin adds none and holds nothing per container
    assert not reply.adjust.linux.devices
    assert claim_12.service.allocation("c1") is None


async def test_a_claim_container_with_another_image_is_refused(claim_12: Setup) -> None:
    with pytest.raises(TtrpcError) as refused:
        evil = {"io.kubernetes.cri.image-name": "docker.io/evil/miner:1"}
        await create(claim_12, claim_container(claim_12.run_dir, image=evil))
    assert refused.value.code == Code.FAILED_PRECONDITION
    assert "is not runtime profile 'pytorch-2.5'" in refused.value.message
    assert claim_12.service.refusal_counts() == {Reason.RUNTIME_PROFILE: 1}


CASES = {
    "another pod sharing the claim": {"uid": "pod-uid-2"},
    "a container mounting no claim, naming the profile in annotations": {
        "claim": False,
        "pod_annotations": {"hcs.io/runtime-profile": "pytorch-2.5"},
    },
}


@pytest.mark.parametrize("change", CASES.values(), ids=CASES.keys())
async def test_what_the_record_does_not_name_gets_nothing(
    claim_12: Setup, change: dict[str, Any]
) -> None:
    reply = await create(claim_12, claim_container(claim_12.run_dir, **change))
    assert not reply.adjust.args and not reply.adjust.env


async def test_a_malformed_record_refuses_the_container(claim_12: Setup) -> None:
    record = claim_12.run_dir / "claims" / f"claim-{CLAIM_UID}" / "runtime.json"
    assert IMAGE in record.read_text()
    record.write_text("{not json")
    with pytest.raises(TtrpcError) as refused:
        await create(claim_12, claim_container(claim_12.run_dir))
    assert "runtime profile record is malformed" in refused.value.message
