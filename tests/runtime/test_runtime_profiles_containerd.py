"""Runtime profiles against a real containerd with runc: a pod whose signed version 3
assignment resolves a profile runs the profile's command with its env merged into the image's
(seen from inside the container, as root and as a non-root user); a container whose image is
not the profile's is refused; a forged profile applies nothing; containerd 1.7 (NRI v0.8, as
2.0 and 2.1: no args adjustment) refuses a profile that replaces the command and applies one
that only sets env."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hcsd.contract.assignment import sign
from hcsd.contract.keyring import Keyring, encode
from tests.harness.daemon import Daemon
from tests.harness.waiting import wait_for
from tests.runtime.containerd import Containerd, CrictlError
from tests.runtime.image import BUSYBOX_IMAGE
from tests.runtime.node import GPU0, KEY, allocations, runtime_hcsd, start_registered

pytestmark = pytest.mark.slow

# What the container prints about itself: its argv as the kernel has it, the merged env.
REPORT = (
    'echo "argv=$(tr "\\0" "|" < /proc/$$/cmdline)"; echo "path=$PATH"; '
    'echo "mode=$RUN_MODE"; echo "code=$HCS_CODE_DIR"; echo "cfg=$HCS_CONFIG"; '
    'echo "cuda=$CUDA_VISIBLE_DEVICES"; echo "uid=$(id -u)"; echo "preload=$LD_PRELOAD"; '
    "echo done"
)
PROFILE: dict[str, Any] = {
    "profile": "busybox-serve",
    "image": "hcs/busybox:test",  # as the operator wrote it; the runtime names it in full
    "env": [
        ["PATH", "/opt/profile/bin"],
        ["RUN_MODE", "profile"],
        ["CUDA_VISIBLE_DEVICES", "all"],
        ["LD_PRELOAD", "/tmp/not-libhcs.so"],
    ],
    "command": ["sh", "-c", REPORT, "profile-entry"],
    "code_mount": "/workspace",
}


def assignment(uid: str, **runtime: Any) -> str:
    body = {
        "v": 3,
        "kid": "k1",
        "node": "rt-node",
        "pod_uid": uid,
        "issued": int(time.time()),
        "containers": {"main": [{"uuid": GPU0, "vram": 2**30, "compute": 0}]},
        "runtime": {"main": {**PROFILE, **runtime}},
    }
    return sign(body, KEY)


def keyring_hcsd(directory: Path, nri_socket: Path) -> Daemon:
    """hcsd for rt-node holding its node key under the id k1, as hcs-syncer installs it."""
    directory.mkdir(parents=True, exist_ok=True)
    keyring = directory / "keyring.json"
    keyring.write_text(encode(Keyring({"k1": KEY}, "k1", "rt-node")))
    keyring.chmod(0o600)
    daemon = runtime_hcsd(directory, nri_socket, key=None)
    daemon.configure({"runtime": {"assignment_keyring_file": str(keyring)}})
    start_registered(daemon)
    return daemon


@pytest.fixture
def hcsd(containerd: Containerd, tmp_path: Path) -> Iterator[Daemon]:
    daemon = keyring_hcsd(tmp_path / "hcsd", containerd.nri_socket)
    yield daemon
    daemon.close()


@pytest.fixture
def code(tmp_path: Path) -> Path:
    """The code volume: a host directory mounted read-only at /workspace."""
    directory = tmp_path / "code"
    directory.mkdir()
    (directory / "train.py").write_text("print('hello')\n")
    return directory


def output(containerd: Containerd, ctr: str) -> dict[str, str]:
    containerd.start(ctr)
    wait_for(lambda: "done" in containerd.logs(ctr), "the container ran")
    lines = [line.partition("=") for line in containerd.logs(ctr).splitlines()]
    return {key: value for key, equals, value in lines if equals}


@pytest.mark.parametrize("user", [None, (1000, 1000)], ids=["root", "non-root"])
def test_the_profile_replaces_the_command_and_merges_the_env(
    containerd: Containerd, hcsd: Daemon, code: Path, user: tuple[int, int] | None
) -> None:
    uid = f"uid-profile-{user is None}"
    pod = containerd.run_pod(
        "serve", "team-a", uid, annotations={"hcs.io/assignment": assignment(uid)}
    )
    ctr = containerd.create_container(
        pod,
        "main",
        command=["sleep", "3600"],  # the pod spec's (the placeholder's) command: replaced
        env={"RUN_MODE": "image", "PATH": "/usr/local/bin:/bin"},
        mounts=[(code, "/workspace")],
        user=user,
    )
    assert allocations(hcsd)[ctr]["source"] == "assignment"
    spec = containerd.runtime_spec(ctr)
    assert spec["process"]["args"] == PROFILE["command"]
    seen = output(containerd, ctr)
    assert seen["argv"] == "|".join(PROFILE["command"]) + "|"  # the shell's own argv
    assert seen["path"] == "/opt/profile/bin:/usr/local/bin:/bin"
    assert seen["mode"] == "profile" and seen["code"] == "/workspace"
    assert seen["cfg"] == "/run/hcs/quota.conf" and seen["cuda"] == GPU0
    assert seen["preload"] == ""
    assert seen["uid"] == str(user[0] if user else 0)
    assert "applying runtime profile 'busybox-serve'" in hcsd.logs()
    assert "not setting CUDA_VISIBLE_DEVICES, LD_PRELOAD" in hcsd.logs()


def test_a_container_whose_image_is_not_the_profiles_is_refused(
    containerd: Containerd, hcsd: Daemon, code: Path
) -> None:
    text = assignment("uid-other", image="nvcr.io/nvidia/pytorch:24.10-py3")
    pod = containerd.run_pod(
        "changed", "team-a", "uid-other", annotations={"hcs.io/assignment": text}
    )
    with pytest.raises(CrictlError) as refused:
        containerd.create_container(pod, "main", mounts=[(code, "/workspace")])
    message = str(refused.value)
    assert f"the container's image '{_full(BUSYBOX_IMAGE)}' is not runtime profile" in message
    assert "(refused: runtime_profile)" in message
    assert allocations(hcsd) == {}


def test_a_forged_profile_applies_nothing(containerd: Containerd, hcsd: Daemon, code: Path) -> None:
    forged = json.loads(assignment("uid-forged"))
    forged["runtime"]["main"]["env"] = [["RUN_MODE", "forged"]]
    pod = containerd.run_pod(
        "forged", "team-a", "uid-forged", annotations={"hcs.io/assignment": json.dumps(forged)}
    )
    with pytest.raises(CrictlError, match="signature does not verify"):
        containerd.create_container(pod, "main", mounts=[(code, "/workspace")])
    assert allocations(hcsd) == {}


@pytest.mark.parametrize("runtime", ["containerd_17", "containerd_21"])
def test_nri_v08_refuses_a_command_profile_and_applies_an_env_one(
    request: pytest.FixtureRequest, runtime: str, tmp_path: Path, code: Path
) -> None:
    """containerd 1.7.35 and 2.1.9 vendor NRI v0.8.0, which has no args adjustment."""
    old: Containerd = request.getfixturevalue(runtime)
    daemon = keyring_hcsd(tmp_path / "hcsd", old.nri_socket)
    try:
        assert "runtime profiles that replace the command: refused" in daemon.logs()
        pod = old.run_pod(
            "old", "team-a", "uid-old", annotations={"hcs.io/assignment": assignment("uid-old")}
        )
        with pytest.raises(CrictlError) as refused:
            old.create_container(pod, "main", mounts=[(code, "/workspace")])
        assert "replaces the container's command, which containerd" in str(refused.value)
        assert "(refused: runtime_profile)" in str(refused.value)
        assert "(refused: runtime_profile)" in daemon.logs()
        text = assignment("uid-env", command=None)
        pod = old.run_pod("env", "team-a", "uid-env", annotations={"hcs.io/assignment": text})
        ctr = old.create_container(
            pod, "main", command=["sh", "-c", REPORT], mounts=[(code, "/workspace")]
        )
        seen = output(old, ctr)
        assert seen["mode"] == "profile" and seen["code"] == "/workspace"
        assert seen["path"].startswith("/opt/profile/bin:")
    finally:
        daemon.close()


def _full(image: str) -> str:
    return image if image.count("/") >= 2 else f"docker.io/{image}"
