"""PrepareClaim / UnprepareClaim against a real hcsd: the ledger record, the quota file and
the CDI spec of a ResourceClaim, repeated calls, and a kill -9 between them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from hcsd.api.client import ApiError, Client
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.contract import dra
from tests.harness.daemon import Daemon

UID = "0f5c2f7e-3b8a-4c39-9a51-7d0f3c1e2a44"
GIB = 2**30


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    libhcs = tmp_path / "libhcs.so"
    libhcs.write_bytes(b"placeholder: these tests check the files, not the library")
    d = Daemon(tmp_path / "hcsd", settings={"runtime": {"nri": False, "libhcs_path": libhcs}})
    d.start()
    yield d
    d.close()


def request(memory: str = "16Gi", compute: str = "30", uid: str = UID) -> pb.PrepareClaimRequest:
    return pb.PrepareClaimRequest(
        claim=pb.PodRef(namespace="team-a", name="train-gpu", uid=uid),
        devices=[
            pb.ClaimDevice(
                request="gpu",
                device="nvidia-0",
                pool="test-node",
                share_id="7e0f4a2c-0000-4000-8000-000000000001",
                memory=memory,
                compute=compute,
            )
        ],
    )


def spec(daemon: Daemon, uid: str = UID) -> dict[str, object]:
    path = Path(daemon.settings["runtime"]["cdi_dir"]) / f"compute.hcs.io-claim_{uid}.json"  # type: ignore[arg-type]
    assert path.stat().st_mode & 0o777 == 0o600
    loaded: dict[str, object] = json.loads(path.read_text())
    return loaded


def test_prepare_holds_the_slice_and_writes_the_claim_spec(daemon: Daemon) -> None:
    with Client(daemon.socket) as client:
        answer = client.prepare_claim(request())
        assert answer.created
        assert [list(d.cdi_device_ids) for d in answer.devices] == [
            [f"{dra.CDI_CLAIM_KIND}={UID}-nvidia-0"]
        ]
        assert answer.devices[0].share_id.startswith("7e0f4a2c")
        (held,) = [a for a in client.allocations() if a.container_id == f"claim-{UID}"]
        assert held.front_end == "dra" and held.source == "claim"
        assert [(g.vram_bytes, g.compute_percent) for g in held.grants] == [(16 * GIB, 30)]
        uuid = held.grants[0].device_uuid
    written = spec(daemon)
    assert written["kind"] == "compute.hcs.io/claim"
    (device,) = written["devices"]  # type: ignore[misc]
    assert device["name"] == f"{UID}-nvidia-0"
    assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == ["/dev/nvidia0"]
    common = written["containerEdits"]
    env = dict(e.split("=", 1) for e in common["env"])  # type: ignore[index]
    assert env["HCS_CONFIG"] == "/run/hcs/quota.conf"
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
    mounts = {m["containerPath"]: m["hostPath"] for m in common["mounts"]}  # type: ignore[index]
    assert {"/run/hcs/quota.conf", "/run/hcs/usage.shm", "/usr/lib/hcs/libhcs.so",
            "/etc/ld.so.preload"} <= set(mounts)  # fmt: skip
    quota = Path(mounts["/run/hcs/quota.conf"]).read_text()
    assert f"device.0.vram_limit={16 * GIB}" in quota
    assert "device.0.compute_percent=30" in quota
    assert "/dev/nvidiactl" in [n["path"] for n in common["deviceNodes"]]  # type: ignore[index]


def test_prepare_twice_is_the_same_answer_and_unprepare_cleans_up(daemon: Daemon) -> None:
    with Client(daemon.socket) as client:
        first = client.prepare_claim(request())
        again = client.prepare_claim(request())
        assert not again.created
        assert again.devices == first.devices
        assert again.allocation == first.allocation
        with pytest.raises(ApiError) as refused:  # the same uid with another allocation
            client.prepare_claim(request(memory="32Gi"))
        assert refused.value.refusal is not None
        assert refused.value.refusal.reason.value == "conflict"
        quota_dir = Path(daemon.settings["daemon"]["run_dir"]) / "claims" / f"claim-{UID}"  # type: ignore[arg-type]
        assert quota_dir.is_dir()
        assert client.unprepare_claim(UID).released
        assert not client.unprepare_claim(UID).released  # a second time: nothing held, no error
        assert not [a for a in client.allocations() if a.container_id == f"claim-{UID}"]
    assert not quota_dir.exists()
    assert not list(Path(daemon.settings["runtime"]["cdi_dir"]).glob("compute.hcs.io-claim_*"))  # type: ignore[arg-type]


def test_a_claim_survives_kill_9_and_is_prepared_again_the_same(daemon: Daemon) -> None:
    with Client(daemon.socket) as client:
        first = client.prepare_claim(request())
    assert daemon.process is not None
    daemon.process.kill()
    daemon.process.wait()
    Path(daemon.socket).unlink(missing_ok=True)
    daemon.start()
    with Client(daemon.socket) as client:
        (held,) = [a for a in client.allocations() if a.container_id == f"claim-{UID}"]
        assert held == first.allocation
        again = client.prepare_claim(request())  # kubelet retries after the restart
        assert not again.created and again.devices == first.devices
        assert client.unprepare_claim(UID).released


@pytest.mark.parametrize(
    ("change", "reason", "text"),
    [
        pytest.param({"device": "nvidia-9"}, "invalid_request", "not on this node", id="no-device"),
        pytest.param({"memory": "lots"}, "invalid_request", "memory", id="bad-memory"),
        pytest.param({"compute": "150"}, "invalid_request", "0-100", id="bad-compute"),
        pytest.param({"memory": "500Gi"}, "over_capacity", "80Gi free", id="too-much-memory"),
    ],
)
def test_a_bad_claim_is_refused_and_holds_nothing(
    daemon: Daemon, change: dict[str, str], reason: str, text: str
) -> None:
    message = request()
    for key, value in change.items():
        setattr(message.devices[0], key, value)
    with Client(daemon.socket) as client:
        with pytest.raises(ApiError) as refused:
            client.prepare_claim(message)
        assert refused.value.refusal is not None
        assert refused.value.refusal.reason.value == reason, refused.value
        assert text in str(refused.value)
        assert not client.allocations()


def test_a_bad_uid_is_refused(daemon: Daemon) -> None:
    with Client(daemon.socket) as client, pytest.raises(ApiError) as refused:
        client.prepare_claim(request(uid="../../etc"))
    assert "not a Kubernetes uid" in str(refused.value)


def test_two_devices_and_two_shares_of_one(daemon: Daemon) -> None:
    """Each device has its own nodes; the selection env names both; two results on one
    device (two shares in one claim) add up to one grant."""
    message = request()
    message.devices.add(request="gpu2", device="nvidia-1", memory="8Gi", compute="20")
    message.devices.add(request="more", device="nvidia-0", memory="4Gi", compute="10")
    with Client(daemon.socket) as client:
        answer = client.prepare_claim(message)
        ids = [list(d.cdi_device_ids) for d in answer.devices]
        assert ids == [
            [f"{dra.CDI_CLAIM_KIND}={UID}-nvidia-0"],
            [f"{dra.CDI_CLAIM_KIND}={UID}-nvidia-1"],
            [f"{dra.CDI_CLAIM_KIND}={UID}-nvidia-0"],
        ]
        grants = [(g.vram_bytes, g.compute_percent) for g in answer.allocation.grants]
        assert grants == [(20 * GIB, 40), (8 * GIB, 20)]
        uuids = [g.device_uuid for g in answer.allocation.grants]
    written = spec(daemon)
    nodes = {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]]
             for d in written["devices"]}  # type: ignore[attr-defined]  # fmt: skip
    assert nodes == {f"{UID}-nvidia-0": ["/dev/nvidia0"], f"{UID}-nvidia-1": ["/dev/nvidia1"]}
    env = dict(e.split("=", 1) for e in written["containerEdits"]["env"])  # type: ignore[index]
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)


RUNTIME = {
    "profile": "pytorch-2.5",
    "image": "registry.example.com/ngc/pytorch:24.10-py3",
    "env": [["NCCL_DEBUG", "WARN"], ["NVIDIA_VISIBLE_DEVICES", "all"]],
    "command": ["python3", "/workspace/train.py"],
    "code_mount": "/workspace",
}


def test_a_resolved_profile_is_recorded_with_the_claim_until_unprepare(daemon: Daemon) -> None:
    """What the kubelet plugin resolved for a profile pod's claim is kept beside its quota
    file for the NRI plugin (tests/nri/test_claim_runtime_profiles.py applies it), with the
    names of the variables the claim's CDI spec sets, which the profile may not override."""
    with_runtime = request()
    with_runtime.runtime = json.dumps(RUNTIME)
    with_runtime.pod_uid = "5a1d0c3e-pod"
    run_dir = Path(daemon.settings["daemon"]["run_dir"])  # type: ignore[arg-type]
    record = run_dir / "claims" / f"claim-{UID}" / "runtime.json"
    with Client(daemon.socket) as client:
        assert client.prepare_claim(with_runtime).created
        written = json.loads(record.read_text())
        assert record.stat().st_mode & 0o777 == 0o600
        assert written["pod_uid"] == "5a1d0c3e-pod"
        assert written["runtime"]["image"] == RUNTIME["image"]
        assert written["runtime"]["command"] == RUNTIME["command"]
        assert {"NVIDIA_VISIBLE_DEVICES", "HCS_CONFIG"} <= set(written["hcsd_env"])
        assert not client.prepare_claim(with_runtime).created  # idempotent, still recorded
        assert record.exists()
        assert client.unprepare_claim(UID).released
    assert not record.exists()


@pytest.mark.parametrize(
    ("runtime", "pod_uid", "words"),
    [
        pytest.param("{not json", "p", "runtime:", id="not-json"),
        pytest.param(json.dumps({**RUNTIME, "args": ["x"], "command": None}), "p",
                     "runtime args need a command", id="args-without-command"),
        pytest.param(json.dumps(RUNTIME), "", "needs the reserving pod's uid", id="no-pod"),
    ],
)  # fmt: skip
def test_a_malformed_profile_refuses_the_claim_and_holds_nothing(
    daemon: Daemon, runtime: str, pod_uid: str, words: str
) -> None:
    bad = request()
    bad.runtime, bad.pod_uid = runtime, pod_uid
    with Client(daemon.socket) as client:
        with pytest.raises(ApiError) as refused:
            client.prepare_claim(bad)
        assert refused.value.refusal is not None
        assert refused.value.refusal.reason.value == "invalid_request"
        assert words in str(refused.value)
        assert not [a for a in client.allocations() if a.container_id == f"claim-{UID}"]
