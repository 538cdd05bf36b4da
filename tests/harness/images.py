"""HCS's cluster image (`make image`), built once per test session for every suite that asks.

The session fixture `cluster_image` (registered in tests/conftest.py) builds the project's
.deb once (narrowed to Debian 12's CPython, as `make image` does) and the image from it with
packaging/build-image, in the session's own directory: a concurrent `make image` cannot
clobber it. Without root or debootstrap it skips, loudly, with the reason.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import hcsd

REPO = Path(__file__).resolve().parents[2]
NAME = f"docker.io/hcs/hcs-cluster:{hcsd.__version__}"


@dataclass(frozen=True)
class ClusterImage:
    """A built image: its tarball, its name, the .deb it was built from, the build's log."""

    path: Path
    name: str
    deb: Path
    seconds: float
    log: str

    def index(self) -> dict[str, object]:
        with tarfile.open(self.path) as tar:
            member = tar.extractfile("index.json")
            assert member is not None
            document: dict[str, object] = json.load(member)
        return document

    def manifest_digest(self) -> str:
        manifests = self.index()["manifests"]
        assert isinstance(manifests, list) and len(manifests) == 1
        return str(manifests[0]["digest"])

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def missing() -> str | None:
    """Why the image cannot be built here, or None."""
    if os.geteuid() != 0:
        return "building the image needs root (unpacking the Debian root, chroot, dpkg)"
    for tool in ("debootstrap", "unshare", "chroot", "dpkg-deb", "fakeroot", "rpmbuild"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/install-test-deps)"
    return None


def _run(command: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}"
            f"{done.stderr[-3000:]}"
        )
    return done.stdout + done.stderr


def build_deb(into: Path) -> Path:
    """The project's .deb with the wheelhouse for CPython 3.11 only (what the image needs)."""
    env = {**os.environ, "HCS_PYTHONS": "3.11", "HCS_DIST": str(into),
           "PYTHON": str(REPO / ".venv/bin/python")}  # fmt: skip
    _run([str(REPO / "packaging/build-packages")], env)
    (deb,) = into.glob("hcsd_*_amd64.deb")
    return deb


def build_image(deb: Path, into: Path) -> ClusterImage:
    """packaging/build-image from `deb` into `into`, timed."""
    env = {**os.environ, "HCS_DEB": str(deb), "HCS_DIST": str(into),
           "PYTHON": str(REPO / ".venv/bin/python")}  # fmt: skip
    started = time.monotonic()
    log = _run([str(REPO / "packaging/build-image")], env)
    path = into / f"hcs-cluster-{hcsd.__version__}.oci.tar"
    return ClusterImage(path, NAME, deb, time.monotonic() - started, log)


@pytest.fixture(scope="session")
def cluster_image(tmp_path_factory: pytest.TempPathFactory) -> ClusterImage:
    """`make image`'s tarball, built once per session (about 3 minutes on 2 cores).

    HCS_TEST_IMAGE=<tarball> and HCS_TEST_DEB=<.deb> take an image built before (by
    `make image` from the same tree) instead, for iterating on a test that runs it."""
    given = os.environ.get("HCS_TEST_IMAGE")
    if given:
        deb = Path(os.environ.get("HCS_TEST_DEB", "/nonexistent"))
        return ClusterImage(Path(given), NAME, deb, 0.0, f"given by HCS_TEST_IMAGE={given}")
    why = missing()
    if why is not None:
        pytest.skip(f"SKIP HCS's cluster image: {why}")
    work = tmp_path_factory.mktemp("image")
    return build_image(build_deb(work / "deb"), work / "dist")


#: hcs-scheduler's image as the chart names it on this harness's API server (v1.36.3). No
#: registry serves it here, so `scheduler_image` writes one of that name from the statically
#: linked kube-scheduler the peers' build made from Kubernetes' Go module.
SCHEDULER_IMAGE = "registry.k8s.io/kube-scheduler:v1.36.3"


def scheduler_image(binary: Path, into: Path) -> Path:
    """An OCI layout tarball named SCHEDULER_IMAGE holding `binary` as
    /usr/local/bin/kube-scheduler, written by packaging/oci_image.py (one layer, non-root
    user 65532 as upstream's distroless image)."""
    spec = importlib.util.spec_from_file_location("oci_image", REPO / "packaging/oci_image.py")
    assert spec is not None and spec.loader is not None
    oci_image = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(oci_image)
    root = into / "root"
    (root / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, root / "usr/local/bin/kube-scheduler")
    version = SCHEDULER_IMAGE.rsplit(":v", 1)[1]
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    labels = {"org.opencontainers.image.title": "kube-scheduler",
              "org.opencontainers.image.licenses": "Apache-2.0"}  # fmt: skip
    layer = oci_image.layer(root, ["/usr/local/bin/kube-scheduler"], epoch, {})
    tarball = into / "kube-scheduler.oci.tar"
    tarball.write_bytes(oci_image.image(layer, SCHEDULER_IMAGE, version, epoch, labels=labels,
                                        cmd=("kube-scheduler",)))  # fmt: skip
    return tarball
