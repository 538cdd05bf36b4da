"""The real-runtime harness on its own (no hcsd): if these fail, the NRI tests cannot be trusted.

The image tests need nothing but busybox-static; the others run a real containerd 2.3 with runc
and crictl (see conftest.py) and are marked slow.
"""

from __future__ import annotations

import hashlib
import io
import json
import socket
import struct
import tarfile
import time
from pathlib import Path

import pytest

from tests.harness.peers.runtimes import Binaries
from tests.runtime.containerd import Containerd, CrictlError, is_socket
from tests.runtime.image import (
    APPLETS,
    BUSYBOX_IMAGE,
    PATH_ENV,
    PAUSE_IMAGE,
    File,
    is_static_elf,
    oci_layout,
)


def _members(tarball: bytes) -> dict[str, bytes | str]:
    """Name → contents (regular files) or link target (symlinks) of a tar archive."""
    found: dict[str, bytes | str] = {}
    with tarfile.open(fileobj=io.BytesIO(tarball)) as tar:
        for member in tar.getmembers():
            if member.issym():
                found[member.name] = member.linkname
            elif member.isfile():
                extracted = tar.extractfile(member)
                assert extracted is not None
                found[member.name] = extracted.read()
    return found


def test_image_layout_is_consistent_and_reproducible() -> None:
    busybox = b"\x7fELF not really busybox"
    tarball = oci_layout("docker.io/hcs/x:test", ["sh"], busybox)
    assert tarball == oci_layout("docker.io/hcs/x:test", ["sh"], busybox)
    files = _members(tarball)
    for name, data in files.items():  # every blob is named by its digest
        if name.startswith("blobs/sha256/"):
            assert isinstance(data, bytes)
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(files["index.json"])
    entry = index["manifests"][0]
    assert entry["annotations"]["io.containerd.image.name"] == "docker.io/hcs/x:test"
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'].split(':')[1]}"])
    (layer_ref,) = manifest["layers"]
    assert layer_ref["mediaType"] == "application/vnd.oci.image.layer.v1.tar"
    layer = files[f"blobs/sha256/{layer_ref['digest'].split(':')[1]}"]
    assert isinstance(layer, bytes)
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert config["rootfs"]["diff_ids"] == [layer_ref["digest"]]  # uncompressed: the same
    assert config["config"]["Cmd"] == ["sh"]
    root = _members(layer)
    assert root["bin/busybox"] == busybox
    assert {f"bin/{applet}" for applet in ("sh", "cat", "ls", "env", "sleep", "stat")} <= set(root)
    assert all(root[f"bin/{applet}"] == "busybox" for applet in APPLETS)
    assert b"root:x:0:0" in root["etc/passwd"]
    assert b"root:x:0:" in root["etc/group"]


def _layer_and_config(tarball: bytes) -> tuple[tarfile.TarFile, dict[str, object]]:
    files = _members(tarball)
    entry = json.loads(files["index.json"])["manifests"][0]
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'].split(':')[1]}"])
    layer = files[f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}"]
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert isinstance(layer, bytes)
    return tarfile.open(fileobj=io.BytesIO(layer)), config


def test_an_image_carries_files_of_its_own_beside_busybox_or_alone() -> None:
    """The kubelet suite's base images (busybox plus files, env) and code image (files only,
    no command): parents made, modes and links kept, reproducible."""
    files = {"usr/local/bin/tool": File(b"#!/bin/sh\n", 0o755), "etc/marker": File(b"m\n"),
             "lib64/ld.so": File(link="/lib/x86_64-linux-gnu/ld.so")}  # fmt: skip
    base = oci_layout("docker.io/hcs/b:test", ["sh"], b"busybox", files, ("A=1",))
    assert base == oci_layout("docker.io/hcs/b:test", ["sh"], b"busybox", files, ("A=1",))
    tar, config = _layer_and_config(base)
    members = {m.name: m for m in tar.getmembers()}
    assert {"bin/busybox", "usr/local", "usr/local/bin", "lib64"} <= set(members)
    assert members["usr/local/bin/tool"].mode == 0o755 and members["etc/marker"].mode == 0o644
    assert members["lib64/ld.so"].linkname == "/lib/x86_64-linux-gnu/ld.so"
    names = [m.name for m in tar.getmembers()]
    assert (
        names.index("usr/local") < names.index("usr/local/bin") < names.index("usr/local/bin/tool")
    )
    assert config["config"] == {"Cmd": ["sh"], "Env": [PATH_ENV, "A=1"], "WorkingDir": "/"}

    code = oci_layout("docker.io/hcs/c:test", [], None, {"train.sh": File(b"x", 0o755)})
    tar, config = _layer_and_config(code)
    assert [m.name for m in tar.getmembers()] == ["train.sh"]
    assert config["config"] == {"Env": [PATH_ENV], "WorkingDir": "/"}


def _elf(*segment_types: int) -> bytes:
    """A little-endian ELF64 header with one program header per segment type."""
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x20, 64)  # e_phoff
    struct.pack_into("<HH", header, 0x36, 56, len(segment_types))  # e_phentsize, e_phnum
    return bytes(header) + b"".join(struct.pack("<I", t) + bytes(52) for t in segment_types)


@pytest.mark.parametrize(
    ("binary", "static"),
    [
        pytest.param(_elf(1, 1), True, id="loads-only"),
        pytest.param(_elf(6, 3, 1), False, id="with-interpreter"),
        pytest.param(b"#!/bin/sh\n", False, id="script"),
    ],
)
def test_only_a_static_busybox_is_accepted(binary: bytes, static: bool) -> None:
    assert is_static_elf(binary) is static


@pytest.mark.slow
def test_images_are_imported_and_pinned(containerd: Containerd) -> None:
    images = containerd.crictl_json("images")["images"]
    tags = {tag: image for image in images for tag in image["repoTags"]}
    assert BUSYBOX_IMAGE in tags and PAUSE_IMAGE in tags
    assert tags[PAUSE_IMAGE]["pinned"], "the sandbox image is pinned (never garbage-collected)"


@pytest.mark.slow
def test_pod_and_container_run_with_env_and_annotations(containerd: Containerd) -> None:
    pod = containerd.run_pod(
        "smoke", "team-a", "uid-smoke", annotations={"hcs.io/vram": "1Gi", "other.io/x": "y"}
    )
    ctr = containerd.create_container(
        pod,
        "main",
        env={"HCS_TEST": "hello world"},
        annotations={"hcs.io/compute": "50", "other.io/z": "w"},
    )
    assert containerd.state(ctr) == "CONTAINER_CREATED"
    containerd.start(ctr)
    view = containerd.inspect(ctr)
    assert view["status"]["state"] == "CONTAINER_RUNNING"
    assert view["status"]["annotations"]["hcs.io/compute"] == "50"
    spec = view["info"]["runtimeSpec"]
    assert "HCS_TEST=hello world" in spec["process"]["env"]
    assert spec["process"]["args"] == ["sleep", "3600"]
    # hcs.io/* pass through to the OCI spec (what hcs-runtime reads); others stay in CRI.
    assert spec["annotations"]["hcs.io/compute"] == "50"
    assert spec["annotations"]["hcs.io/vram"] == "1Gi"
    assert "other.io/z" not in spec["annotations"]
    assert spec["annotations"]["io.kubernetes.cri.sandbox-namespace"] == "team-a"
    pod_view = containerd.inspect_pod(pod)
    assert pod_view["status"]["state"] == "SANDBOX_READY"
    assert pod_view["status"]["annotations"]["other.io/x"] == "y"

    assert containerd.exec(ctr, "sh", "-c", "echo $HCS_TEST") == (0, "hello world\n")
    assert containerd.exec(ctr, "sh", "-c", "exit 3")[0] == 3
    rc, out = containerd.exec(ctr, "cat", "/etc/passwd")
    assert rc == 0 and out.startswith("root:x:0:0")

    containerd.stop_container(ctr, timeout=1)
    assert containerd.state(ctr) == "CONTAINER_EXITED"
    containerd.remove_container(ctr)
    containerd.stop_pod(pod)
    containerd.remove_pod(pod)
    assert containerd.crictl_json("pods")["items"] == []


@pytest.mark.slow
def test_container_output_and_exit_code(containerd: Containerd) -> None:
    pod = containerd.run_pod("once", "team-a")
    ctr = containerd.create_container(
        pod, "main", command=["sh", "-c", "echo out; echo err >&2; exit 7"]
    )
    containerd.start(ctr)
    assert containerd.wait_exited(ctr) == 7
    assert sorted(containerd.logs(ctr).splitlines()) == ["err", "out"]


@pytest.mark.slow
def test_a_failed_creation_raises_with_the_runtime_text(containerd: Containerd) -> None:
    pod = containerd.run_pod("bad", "team-a")
    with pytest.raises(CrictlError, match=r"docker\.io/hcs/missing:test") as failure:
        containerd.create_container(pod, "main", image="docker.io/hcs/missing:test")
    assert "rpc error" not in failure.value.runtime_error  # only the runtime's own words
    assert failure.value.command[0] == "create"


@pytest.mark.slow
def test_restart_keeps_the_running_container(containerd: Containerd) -> None:
    pod = containerd.run_pod("long", "team-a")
    ctr = containerd.create_container(pod, "main")
    containerd.start(ctr)
    pid = containerd.inspect(ctr)["info"]["pid"]
    old = containerd.process
    containerd.restart()
    assert containerd.process is not old
    view = containerd.inspect(ctr)
    assert view["status"]["state"] == "CONTAINER_RUNNING"
    assert view["info"]["pid"] == pid, "the same process, not a new one"
    assert containerd.exec(ctr, "echo", "still here") == (0, "still here\n")
    assert is_socket(containerd.nri_socket), "NRI listens again after the restart"


@pytest.mark.slow
def test_nri_socket_is_at_the_configured_path(containerd: Containerd, tmp_path: Path) -> None:
    assert containerd.nri_socket == tmp_path / "nri" / "nri.sock"
    assert is_socket(containerd.nri_socket)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(2)
        client.connect(str(containerd.nri_socket))  # containerd accepts plugin connections
    config = containerd.config.read_text()
    assert f'socket_path = "{containerd.nri_socket}"' in config
    assert "plugin_request_timeout" in config


@pytest.mark.slow
def test_containerd_17_runs_a_pod_with_nri_on(
    runtime_binaries_17: Binaries, tmp_path: Path
) -> None:
    """Optional peer: skipped with the reason when containerd 1.7 cannot be built here."""
    with Containerd(runtime_binaries_17, tmp_path / "c17", nri_socket=tmp_path / "nri.sock") as old:
        assert is_socket(old.nri_socket)
        pod = old.run_pod("legacy", "team-a")
        ctr = old.create_container(pod, "main", env={"A": "b"})
        old.start(ctr)
        assert old.exec(ctr, "sh", "-c", "echo $A") == (0, "b\n")
        assert runtime_binaries_17.containerd_version in old.crictl("version")
        started = time.monotonic()
        old.stop_pod(pod)
        assert time.monotonic() - started < 10
