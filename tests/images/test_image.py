"""HCS's cluster image (`make image`, docs/images.md): what it says it is, what it holds, that
it is the same bytes when built again, and that containerd imports and runs it.

Slow: the session builds the image once (the `cluster_image` fixture, tests/harness/images.py)
and the reproducibility test builds it a second time from the same .deb.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import shutil
import subprocess
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import hcsd
from tests.harness.images import REPO, ClusterImage, build_image
from tests.harness.peers.runtimes import ensure_binaries
from tests.harness.waiting import wait_for
from tests.runtime.containerd import Containerd

pytestmark = pytest.mark.slow

NONROOT = 65532
PROGRAMS = sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])


def skopeo(*args: str) -> dict[str, object]:
    if shutil.which("skopeo") is None:
        pytest.skip("SKIP skopeo checks: skopeo is not installed (scripts/install-test-deps)")
    done = subprocess.run(
        ["skopeo", *args], capture_output=True, text=True, timeout=120, check=True
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


@contextlib.contextmanager
def layer(image: ClusterImage) -> Iterator[tarfile.TarFile]:
    """The image's one layer, streamed (the manifest names it by digest)."""
    with tarfile.open(image.path) as outer:
        blob = outer.extractfile(f"blobs/sha256/{image.manifest_digest().split(':')[1]}")
        assert blob is not None
        (only,) = json.load(blob)["layers"]
        data = outer.extractfile(f"blobs/sha256/{only['digest'].split(':')[1]}")
        assert data is not None
        with tarfile.open(fileobj=gzip.GzipFile(fileobj=data), mode="r|") as tar:
            yield tar


def layer_members(image: ClusterImage) -> dict[str, tarfile.TarInfo]:
    with layer(image) as tar:
        return {member.name: member for member in tar}


def read_member(image: ClusterImage, name: str) -> str:
    with layer(image) as tar:
        for member in tar:
            if member.name == name:
                content = tar.extractfile(member)
                assert content is not None
                return content.read().decode()
    raise AssertionError(f"{name} is not in the image")


def test_the_image_names_its_version_and_runs_as_nonroot(cluster_image: ClusterImage) -> None:
    size = cluster_image.path.stat().st_size
    print(f"{cluster_image.path.name}: {size} bytes, built in {cluster_image.seconds:.0f} s")
    manifests = cluster_image.index()["manifests"]
    assert isinstance(manifests, list)
    (entry,) = manifests
    assert entry["annotations"]["io.containerd.image.name"] == cluster_image.name
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == hcsd.__version__
    assert cluster_image.name.endswith(f":{hcsd.__version__}")
    reference = f"oci-archive:{cluster_image.path}"
    shown = skopeo("inspect", reference)
    assert shown["Architecture"] == "amd64" and shown["Os"] == "linux"
    assert shown["Digest"] == cluster_image.manifest_digest()
    labels = shown["Labels"]
    assert isinstance(labels, dict)
    assert labels["org.opencontainers.image.version"] == hcsd.__version__
    config = skopeo("inspect", "--config", reference)["config"]
    assert isinstance(config, dict)
    assert config["User"] == f"{NONROOT}:{NONROOT}"
    assert config["Cmd"] == ["hcs-syncer", "--help"]
    # skopeo finds it by its tag too, as `skopeo copy oci-archive:FILE:TAG docker://…` would
    assert skopeo("inspect", f"{reference}:{hcsd.__version__}")["Digest"] == shown["Digest"]


def test_the_layer_holds_the_programs_and_not_the_rest(cluster_image: ClusterImage) -> None:
    members = layer_members(cluster_image)
    total = sum(m.size for m in members.values())
    print(f"layer: {len(members)} entries, {total} bytes of file content")
    for program in PROGRAMS:
        assert f"opt/hcsd/venv/bin/{program}" not in members  # venv is a link: resolve it
        venv = members["opt/hcsd/venv"].linkname
        assert f"opt/hcsd/{venv}/bin/{program}" in members, program
    assert members["usr/bin/hcs-syncer"].linkname == "/opt/hcsd/venv/bin/hcs-syncer"
    assert "usr/bin/python3.11" in members
    never = ("usr/share/man/", "usr/share/locale/", "boot/", "usr/lib/modules/", "usr/share/info/",
             "usr/lib/systemd/", "var/lib/apt/lists/", "usr/lib/hcs/wheels/")  # fmt: skip
    assert not [n for n in members if n.startswith(never)]
    for program in ("usr/bin/dpkg", "usr/bin/apt", "usr/bin/dash", "usr/bin/bash", "usr/bin/perl",
                    "usr/bin/systemctl"):  # fmt: skip
        assert program not in members, program
    docs = [n for n in members if n.startswith("usr/share/doc/") and members[n].isfile()]
    assert docs and all(n.endswith("/copyright") for n in docs)
    assert not [n for n in members if "/site-packages/kubernetes/aio/" in n]
    epoch = int(subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=REPO, check=True,
                               capture_output=True, text=True).stdout)  # fmt: skip
    assert max(m.mtime for m in members.values()) <= epoch  # clamped to the commit's time
    assert {m.uname for m in members.values()} == {""}  # owners by number only
    assert f"nonroot:x:{NONROOT}:{NONROOT}:" in read_member(cluster_image, "etc/passwd")
    status = read_member(cluster_image, "var/lib/dpkg/status")
    packages = {line.split(": ")[1] for line in status.splitlines() if line.startswith("Package:")}
    assert {"python3", "python3.11", "libc6", "libstdc++6", "hcsd"} <= packages
    assert not packages & {"systemd", "dpkg", "apt", "perl-base", "linux-image-amd64"}
    print(f"{len(packages)} Debian packages: {' '.join(sorted(packages))}")


def test_a_second_build_gives_the_same_digest(cluster_image: ClusterImage, tmp_path: Path) -> None:
    """Same commit, same .deb: the same bytes (times clamped, entries sorted, .pyc compiled
    with a fixed seed). The .deb is shared: the test is of the image step, the part with
    times, owners and byte-compiled files in it."""
    if not cluster_image.deb.is_file():
        pytest.skip(f"SKIP the second build: no .deb of the first ({cluster_image.log})")
    again = build_image(cluster_image.deb, tmp_path)
    print(f"first build {cluster_image.seconds:.0f} s, second {again.seconds:.0f} s; "
          f"manifest {again.manifest_digest()}")  # fmt: skip
    assert again.manifest_digest() == cluster_image.manifest_digest()
    assert again.sha256() == cluster_image.sha256()


@pytest.fixture
def containerd(tmp_path: Path) -> Iterator[Containerd]:
    binaries = ensure_binaries()
    if isinstance(binaries, str):
        pytest.skip(f"SKIP running the image: the runtime peers cannot be had here: {binaries}")
    with Containerd(binaries, tmp_path / "containerd") as runtime:
        yield runtime


def run(runtime: Containerd, pod: str, name: str, image: str, *command: str) -> tuple[int, str]:
    """`command` in a container of `image` as the image configures it (user, env); its exit
    code and output."""
    container = runtime.create_container(pod, name, image=image, command=list(command))
    runtime.start(container)
    code = runtime.wait_exited(container, timeout=60)
    return code, runtime.logs(container)


def test_containerd_imports_it_and_its_programs_run(
    cluster_image: ClusterImage, containerd: Containerd
) -> None:
    containerd.import_image(cluster_image.path)

    def listed() -> bool:  # the CRI plugin learns of an imported image from an event, later
        images = containerd.crictl_json("images")["images"]
        return cluster_image.name in [t for i in images for t in i.get("repoTags", [])]

    wait_for(listed, f"crictl images lists {cluster_image.name}", timeout=30)
    pod = containerd.run_pod("image-check")
    for program in ("hcs-syncer", "hcs-scheduler-extender"):
        code, out = run(containerd, pod, program, cluster_image.name, program, "--help")
        assert code == 0 and f"usage: {program}" in out, out
    for program in ("hcsd", "hcs-syncer", "hcs-scheduler-extender"):
        code, out = run(containerd, pod, f"{program}-version", cluster_image.name, program,
                        "--version")  # fmt: skip
        assert code == 0 and out.strip() == f"{program} {hcsd.__version__}", out
    # the native parts load: grpc's extension (libstdc++), PyYAML's, msgpack's, the client
    code, out = run(containerd, pod, "imports", cluster_image.name, "python3", "-c",
                    "import grpc._cython.cygrpc, yaml, msgpack, kubernetes.client, "
                    "hcsd.cluster.commands, hcsd.daemon.lifecycle; print('imported')")  # fmt: skip
    assert code == 0 and out.strip() == "imported", out
    code, out = run(containerd, pod, "whoami", cluster_image.name, "python3", "-c",
                    "import os; print(os.getuid(), os.getgid())")  # fmt: skip
    assert code == 0 and out.split() == [str(NONROOT), str(NONROOT)], out
