"""Checkpoint resume with a real containerd 2.x and runc, hcsd with only its unit's
capabilities: a pod whose volume (written by uid 1000, as a non-root trainer leaves it) holds
step-1 and step-2 complete and step-3 half written gets HCS_RESUME_FROM=/ckpt/step-2 and
HCS_RESUME_STATUS=found, read inside the container by root and by a non-root user; a
replacement created after step-3 completes gets step-3; an empty volume gives `none`, a
malformed path `unknown`; a container hcsd gives no devices gets nothing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.capabilities import setpriv_prefix
from tests.harness.daemon import Daemon
from tests.harness.waiting import wait_for
from tests.runtime.containerd import Containerd
from tests.runtime.node import runtime_hcsd, start_registered

pytestmark = pytest.mark.slow

READ = (
    "echo resume=${HCS_RESUME_FROM-unset} status=${HCS_RESUME_STATUS-unset} uid=$(id -u); "
    'test -f "$HCS_RESUME_FROM/COMPLETE" && echo marker-visible; echo done'
)


@pytest.fixture
def hcsd(containerd: Containerd, tmp_path: Path) -> Iterator[Daemon]:
    daemon = runtime_hcsd(tmp_path / "hcsd", containerd.nri_socket)
    daemon.prefix = setpriv_prefix()  # no CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH
    start_registered(daemon)
    yield daemon
    daemon.close()


def step(volume: Path, number: int, *, complete: bool = True) -> None:
    directory = volume / f"step-{number}"
    directory.mkdir(parents=True)
    (directory / "model.pt").write_bytes(b"weights")
    if complete:
        (directory / "COMPLETE").write_text("")


def run(
    containerd: Containerd,
    pod: str,
    name: str,
    volume: Path,
    *,
    user: tuple[int, int] | None = None,
    annotations: dict[str, str] | None = None,
) -> str:
    """Create and start a container reading its resume path; what it printed."""
    ctr = containerd.create_container(
        pod,
        name,
        command=["sh", "-c", READ],
        annotations={"hcs.io/vram": "1Gi"} if annotations is None else annotations,
        mounts=[(volume, "/ckpt")],
        user=user,
    )
    containerd.start(ctr)
    containerd.wait_exited(ctr)
    wait_for(lambda: "done" in containerd.logs(ctr), f"{name} ran")
    return containerd.logs(ctr)


def test_the_newest_complete_checkpoint_is_injected(
    containerd: Containerd, hcsd: Daemon, tmp_path: Path
) -> None:
    volume = tmp_path / "volume"
    step(volume, 1)
    step(volume, 2)
    step(volume, 3, complete=False)
    for path in (volume, *volume.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
        os.chown(path, 1000, 1000)
    pod = containerd.run_pod(
        "trainer", "team-a", "uid-resume", annotations={"hcs.io/checkpoint-path": "/ckpt"}
    )
    out = run(containerd, pod, "root", volume)
    assert "resume=/ckpt/step-2 status=found uid=0" in out and "marker-visible" in out, out
    out = run(containerd, pod, "user", volume, user=(1000, 1000))
    assert "resume=/ckpt/step-2 status=found uid=1000" in out and "marker-visible" in out, out
    assert "team-a/trainer/user: resuming from the newest complete checkpoint" in hcsd.logs()

    (volume / "step-3" / "COMPLETE").write_text("")  # the failed pod's last save, finished
    os.chown(volume / "step-3" / "COMPLETE", 1000, 1000)
    out = run(containerd, pod, "replacement", volume, user=(1000, 1000))
    assert "resume=/ckpt/step-3 status=found uid=1000" in out, out

    out = run(containerd, pod, "sidecar", volume, annotations={})
    assert "resume=unset status=unset" in out, out  # no devices from hcsd: not looked at

    empty = tmp_path / "empty"
    empty.mkdir()
    out = run(containerd, pod, "first-run", empty)
    assert "resume=unset status=none" in out, out


def test_a_malformed_path_starts_the_container_without_it(
    containerd: Containerd, hcsd: Daemon, tmp_path: Path
) -> None:
    volume = tmp_path / "volume"
    step(volume, 1)
    pod = containerd.run_pod(
        "typo", "team-b", "uid-typo", annotations={"hcs.io/checkpoint-path": "/ckpt/../ckpt"}
    )
    out = run(containerd, pod, "main", volume)
    assert "resume=unset status=unknown" in out, out
    assert "team-b/typo/main: no checkpoint resume: hcs.io/checkpoint-path:" in hcsd.logs()
