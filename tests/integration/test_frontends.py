"""The runc wrapper and the OCI hook with Debian's runc on real bundles, against a real hcsd."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.frontends.bundle import container_user
from tests.harness.bundles import BIN, hcs_runtime, make_bundle
from tests.harness.daemon import Daemon

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="runc needs root"),
    pytest.mark.skipif(
        shutil.which("runc") is None, reason="runc is not installed (apt install runc)"
    ),
    pytest.mark.skipif(
        not os.path.exists("/bin/busybox"),
        reason="busybox is not installed (apt install busybox-static)",
    ),
]

A100_0 = "GPU-5b2f0c0e-8d1a-4c11-9d2e-a100a100a000"


@pytest.fixture
def hcsd(tmp_path: Path) -> Iterator[Daemon]:
    libhcs = tmp_path / "libhcs.so"
    libhcs.write_bytes(b"placeholder: the bundle test checks the mount, not the library")
    daemon = Daemon(tmp_path / "hcsd", settings={"runtime": {"nri": False, "libhcs_path": libhcs}})
    daemon.start()
    yield daemon
    daemon.close()


def runtime(daemon: Daemon, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return hcs_runtime(daemon, root, *args, capture_output=True, text=True)


INSPECT = (
    "stat -c '%F %t %T' /dev/nvidia0; echo cuda=$CUDA_VISIBLE_DEVICES; echo cfg=$HCS_CONFIG; "
    "cat /run/hcs/quota.conf; cat /etc/ld.so.preload; ls /dev"
)


def test_runc_wrapper_injects_devices_env_mounts_and_quota(hcsd: Daemon, tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, {"hcs.io/vram": "8Gi", "hcs.io/vendors": "nvidia"}, INSPECT)
    result = runtime(hcsd, tmp_path, "run", "--keep", "--bundle", str(bundle), "job-1")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "character special file c3 0" in out  # major 195, minor 0
    assert f"cuda={A100_0}" in out and "cfg=/run/hcs/quota.conf" in out
    assert "device.0.vram_limit=8589934592" in out
    assert "/usr/lib/hcs/libhcs.so" in out  # /etc/ld.so.preload was replaced by ours
    assert "nvidia1" not in out  # only the granted GPU
    held = json.loads(hcsd.hcsctl("--json", "allocations").stdout)
    assert [a["container_id"] for a in held] == ["job-1"]
    gone = runtime(hcsd, tmp_path, "delete", "job-1")
    assert gone.returncode == 0, gone.stderr
    assert json.loads(hcsd.hcsctl("--json", "allocations").stdout) == []


def test_runc_wrapper_gives_the_region_to_the_containers_user(hcsd: Daemon, tmp_path: Path) -> None:
    """A non-root container (process.user 1000:1000) reads its quota and preload files and
    writes the usage region hcsd made for it."""
    script = (
        "id -u; cat /run/hcs/quota.conf > /dev/null && echo quota-readable; "
        "test -r /etc/ld.so.preload && echo preload-readable; "
        "test -w /run/hcs/usage.shm && echo region-writable"
    )
    bundle = make_bundle(tmp_path, {"hcs.io/vram": "8Gi"}, script)
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["user"] = {"uid": 1000, "gid": 1000}
    (bundle / "config.json").write_text(json.dumps(config))
    result = runtime(hcsd, tmp_path, "run", "--keep", "--bundle", str(bundle), "job-u")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "1000",
        "quota-readable",
        "preload-readable",
        "region-writable",
    ]
    region = hcsd.dir / "containers" / "job-u" / "usage.shm"
    assert (region.stat().st_uid, region.stat().st_gid) == (1000, 1000)
    assert runtime(hcsd, tmp_path, "delete", "job-u").returncode == 0


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param({"process": {"user": {"uid": 1000, "gid": 100}}}, (1000, 100), id="user"),
        pytest.param({"process": {}}, None, id="no-user"),
        pytest.param({"process": {"user": {"uid": "1000", "gid": 1}}}, None, id="malformed"),
        pytest.param(
            {
                "process": {"user": {"uid": 1000, "gid": 1000}},
                "linux": {
                    "namespaces": [{"type": "user"}],
                    "uidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
                    "gidMappings": [{"containerID": 0, "hostID": 200000, "size": 65536}],
                },
            },
            (101000, 201000),
            id="user-namespace",
        ),
        pytest.param(
            {
                "process": {"user": {"uid": 70000, "gid": 0}},
                "linux": {
                    "namespaces": [{"type": "user"}],
                    "uidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
                    "gidMappings": [{"containerID": 0, "hostID": 200000, "size": 65536}],
                },
            },
            None,
            id="unmapped",
        ),
    ],
)
def test_the_hooks_tell_hcsd_who_the_container_runs_as_on_the_host(
    config: dict[str, object], expected: tuple[int, int] | None
) -> None:
    user = container_user(config)
    assert (None if user is None else (user.uid, user.gid)) == expected
    assert user is None or isinstance(user, pb.ContainerUser)


def test_runc_wrapper_refusal_fails_creation_with_the_reason(hcsd: Daemon, tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, {"hcs.io/vram": "1Ti"}, "true")
    result = runtime(hcsd, tmp_path, "run", "--bundle", str(bundle), "too-big")
    assert result.returncode == 1
    assert result.stderr.startswith("hcs-runtime: too-big: ") and "1Ti wanted" in result.stderr


def test_runc_wrapper_passes_other_containers_through(hcsd: Daemon, tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, {}, "echo untouched; ls /dev")
    result = runtime(hcsd, tmp_path, "run", "--bundle", str(bundle), "plain")
    assert result.returncode == 0 and "untouched" in result.stdout
    assert "nvidia" not in result.stdout


def with_hook(bundle: Path, daemon: Daemon) -> None:
    config = json.loads((bundle / "config.json").read_text())
    hook = {
        "path": str(BIN / "hcs-oci-hook"),
        "args": ["hcs-oci-hook", "createRuntime"],
        "env": [f"HCS_SOCKET={daemon.socket}", f"PATH={os.environ['PATH']}"],
    }
    config.setdefault("hooks", {})["createRuntime"] = [hook]
    (bundle / "config.json").write_text(json.dumps(config))


def test_oci_hook_refuses_a_container_whose_devices_were_not_injected(
    hcsd: Daemon, tmp_path: Path
) -> None:
    bundle = make_bundle(tmp_path, {"hcs.io/vram": "2Gi", "hcs.io/vendors": "nvidia"}, "true")
    with_hook(bundle, hcsd)
    result = subprocess.run(
        ["runc", "--root", str(tmp_path / "state"), "run", "--bundle", str(bundle), "hooked"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "hcsd's edits were not injected: /dev/nvidia-uvm, /dev/nvidia-uvm-tools, " in (
        result.stderr
    )
    assert (
        "/dev/nvidia0, /dev/nvidiactl, mount /etc/ld.so.preload, mount /run/hcs/quota.conf, "
        in (result.stderr)
    )
    assert "(refused: not_injected)" in result.stderr
    assert json.loads(hcsd.hcsctl("--json", "allocations").stdout) == []  # released


def cdi_like(bundle: Path) -> None:
    """What a runtime with CDI (or a device plugin) but no hcsd NRI plugin gives the container:
    the device nodes and the vendor's env, no libhcs, no preload, no quota file."""
    config = json.loads((bundle / "config.json").read_text())
    config["linux"]["devices"] = [
        {"path": path, "type": "c", "major": 195, "minor": minor, "fileMode": 0o666}
        for path, minor in (
            ("/dev/nvidia0", 0),
            ("/dev/nvidiactl", 255),
            ("/dev/nvidia-uvm", 0),
            ("/dev/nvidia-uvm-tools", 1),
        )
    ]
    config["process"]["env"].append(f"NVIDIA_VISIBLE_DEVICES={A100_0}")
    (bundle / "config.json").write_text(json.dumps(config))


def test_oci_hook_refuses_devices_without_the_quota_edits(hcsd: Daemon, tmp_path: Path) -> None:
    """CRI-O or podman with CDI: the devices are there, libhcs is not; the container would
    have the whole device. The hook refuses it with hcsd's reason, and nothing stays held."""
    bundle = make_bundle(tmp_path, {"hcs.io/vram": "2Gi", "hcs.io/vendors": "nvidia"}, "true")
    cdi_like(bundle)
    with_hook(bundle, hcsd)
    result = subprocess.run(
        ["runc", "--root", str(tmp_path / "state"), "run", "--bundle", str(bundle), "cdi-only"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0, result.stdout
    assert (
        "hcs-oci-hook: cdi-only: hcsd's edits were not injected: mount /etc/ld.so.preload, "
        "mount /run/hcs/quota.conf, mount /run/hcs/usage.shm, mount /usr/lib/hcs/libhcs.so, "
        "env HCS_CONFIG"
    ) in result.stderr
    assert "/dev/nvidia0" not in result.stderr.split("(")[0]  # the devices were there
    assert "(refused: not_injected)" in result.stderr
    assert json.loads(hcsd.hcsctl("--json", "allocations").stdout) == []
    assert not (hcsd.dir / "containers" / "cdi-only").exists()
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{hcsd.port}/metrics", timeout=10)
    assert 'hcs_refusals_total{reason="not_injected"} 1.0' in metrics.read().decode()


def test_oci_hook_accepts_an_injected_container(hcsd: Daemon, tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, {"hcs.io/vram": "2Gi"}, "echo hooked-ok")
    with_hook(bundle, hcsd)
    result = runtime(hcsd, tmp_path, "run", "--bundle", str(bundle), "hooked-2")
    assert result.returncode == 0, result.stderr
    assert "hooked-ok" in result.stdout


@pytest.mark.parametrize("state", ["", "{", '{"id": 1}', "[]"])
def test_oci_hook_rejects_malformed_state(hcsd: Daemon, state: str) -> None:
    result = subprocess.run(
        [str(BIN / "hcs-oci-hook"), "createRuntime"],
        input=state,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=dict(os.environ, HCS_SOCKET=hcsd.socket),
    )
    assert result.returncode == 1
    assert result.stderr.startswith("hcs-oci-hook: malformed container state on stdin")
