"""End-to-end fixtures: the packages (built once per session) and the cached Debian 12 root.

Every prerequisite that is missing skips with the reason; nothing here runs without root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("HCS_CACHE", Path.home() / ".cache" / "hcs"))
HERE = Path(__file__).resolve().parent


def need(*tools: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("SKIP e2e: needs root (chroot, dpkg, rpm --root, mkfs)")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"SKIP e2e: missing {', '.join(missing)} (scripts/install-test-deps)")


def sh(*args: str | Path, check: bool = True, timeout: float = 600, **kw: object) -> str:
    result = subprocess.run(
        [str(a) for a in args], check=False, capture_output=True, text=True, timeout=timeout, **kw
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, args))} exited {result.returncode}\n"
            f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    return result.stdout + result.stderr


def in_root(root: Path, script: str, check: bool = True, timeout: float = 300) -> str:
    """Run a shell script chrooted in root, with /proc, /dev and a fresh /run in a private
    mount namespace: the mounts vanish with the process, also when the test fails."""
    setup = (
        f"mount -t proc proc {root}/proc && mount --rbind /dev {root}/dev && "
        f"mount -t tmpfs tmpfs {root}/run && mount -t tmpfs tmpfs {root}/tmp && "
        f'exec chroot {root} /bin/sh -ec "$1"'
    )
    return sh(
        "unshare", "--mount", "--propagation", "private", "--fork",
        "sh", "-c", setup, "in-root", script,
        check=check, timeout=timeout,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8",
             "DEBIAN_FRONTEND": "noninteractive"},
    )  # fmt: skip


@pytest.fixture(scope="session")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Release 1 and release 2 (the upgrade) of both packages, built by `make package`."""
    need("dpkg-deb", "rpmbuild", "fakeroot")
    out: dict[str, Path] = {}
    dist = tmp_path_factory.mktemp("dist")  # private: a concurrent `make package` cannot clobber it
    for release in ("1", "2"):
        env = {
            **os.environ,
            "HCS_RELEASE": release,
            "HCS_DIST": str(dist),
            "PYTHON": str(REPO / ".venv/bin/python"),
        }
        log = sh(REPO / "packaging/build-packages", cwd=REPO, env=env, timeout=900)
        print(log)
        version = sh(REPO / ".venv/bin/python", "-c", "import hcsd; print(hcsd.__version__)")
        version = version.strip() + "-" + release
        out[f"deb{release}"] = dist / f"hcsd_{version}_amd64.deb"
        out[f"rpm{release}"] = dist / f"hcsd-{version}.x86_64.rpm"
    return out


@pytest.fixture(scope="session")
def root_tarball() -> Path:
    need("debootstrap", "unshare", "chroot")
    try:
        path = sh(HERE / "make-debian-root", CACHE, timeout=1200).strip().splitlines()[-1]
    except AssertionError as e:
        pytest.skip(f"SKIP e2e: cannot build the Debian 12 root (mirror unreachable?): {e}")
    return Path(path)


@pytest.fixture(scope="session")
def chrdev_module(root_tarball: Path) -> Path | str:
    """The test module registering the Ascend and Cambricon drivers' char-device names, built
    for the root's kernel (tests/e2e/make-chrdev-module); else why it cannot be built (no
    mirror), for the VM's device test to skip with (the rest of the VM test runs without)."""
    try:
        path = sh(HERE / "make-chrdev-module", CACHE, root_tarball, timeout=1200)
    except AssertionError as e:
        return f"cannot build the char-device test module: {e}"
    return Path(path.strip().splitlines()[-1])


@pytest.fixture
def debian_root(root_tarball: Path, tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "root"
    root.mkdir()
    sh("tar", "-C", root, "-xzf", root_tarball)
    yield root
    shutil.rmtree(root, ignore_errors=True)


# Points hcsd at the shipped example node; everything that needs a host (NRI, eBPF) is off.
TEST_CONFIG = """\
[discovery]
backends = ["simulated"]
simulated_node = "/usr/share/hcsd/examples/nodes/mixed.toml"
[metrics]
listen = ""
[health]
source = "off"
[runtime]
nri = false
"""
