"""The arm64 packages (`make package ARCH=arm64`) built on this x86 machine: architecture fields,
every ELF inside (libhcs, the eBPF objects, each wheel's extension modules), lint as clean as
the amd64 packages, and the aarch64 parts run under qemu-user in a Debian 12 arm64 root: the
wheelhouse's extension modules load in its CPython 3.11, libhcs preloads into its shell, and,
where the kernel gives a user namespace its own binfmt_misc (Linux >= 6.7), the .deb installs
there with dpkg, builds its venv in the postinst, runs hcsd and is removed and purged.

Slow: the first run cross-builds libhcs, downloads aarch64 wheels and builds the arm64 root
(its second stage runs emulated: 10-16 minutes on two busy cores; cached in ~/.cache/hcs).
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import zipfile
from pathlib import Path

import pytest

from tests.e2e.conftest import CACHE, HERE, REPO, TEST_CONFIG, need, sh

pytestmark = pytest.mark.slow

EM_X86_64, EM_AARCH64, EM_BPF = 62, 183, 247
VERSION = "0.1.0-1"

# Imports every extension module found under a directory, then hcsd's daemon and cluster side.
PROBE = """
import importlib, pathlib, platform, sys
site = pathlib.Path(sys.argv[1]); sys.path.insert(0, str(site))
loaded = []
for so in sorted(site.rglob("*.so")):
    parts = so.relative_to(site).with_suffix("").parts
    if any(part.endswith(".libs") for part in parts[:-1]):
        continue  # auditwheel's vendored libraries (numpy.libs/...), loaded by their modules
    importlib.import_module(".".join(parts[:-1] + (parts[-1].split(".")[0],)))
    loaded.append(so.name)
import hcsd, hcsd.daemon.lifecycle, hcsd.cluster
print("PROBE", platform.machine(), sys.version.split()[0], hcsd.__version__, len(loaded))
"""


# Inside the arm64 root: install, run hcsd on the shipped simulated node, remove, purge. The
# root is minbase, without systemd, which the package depends on: --force-depends (the
# maintainer scripts' systemd steps are guarded; the amd64 test runs them with systemd).
INSTALL = (
    """
dpkg --print-architecture; uname -m
dpkg -i --force-depends /tmp-hcsd.deb
hcsd --version; hcs-syncer --version; hcs-scheduler-extender --version
/opt/hcsd/venv/bin/python -c 'import grpc, platform; print("VENV", platform.machine())'
cat > /etc/hcsd/hcsd.toml <<'X'
"""
    + TEST_CONFIG
    + """X
hcsd --config /etc/hcsd/hcsd.toml & pid=$!
for i in $(seq 600); do [ -S /run/hcsd/api/hcsd.sock ] && break; sleep 0.5; done
hcsctl devices; hcsctl allocate --container e2e-1 --vram 1Gi
kill $pid; wait $pid
dpkg -r hcsd; test ! -e /opt/hcsd && echo VENV-GONE
dpkg -P hcsd; test ! -e /etc/hcsd && test ! -e /usr/lib/hcs && echo PURGED
"""
)


def elf_machine(data: bytes) -> int | None:
    """e_machine of an ELF file's first bytes (little-endian, as both targets are), else None."""
    if data[:4] != b"\x7fELF" or len(data) < 20:
        return None
    return int(struct.unpack_from("<H", data, 18)[0])


@pytest.fixture(scope="module")
def arm64(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The arm64 .deb and .rpm, and the .deb unpacked."""
    need("dpkg-deb", "rpmbuild", "fakeroot", "aarch64-linux-gnu-gcc")
    dist = tmp_path_factory.mktemp("dist-arm64")
    env = {**os.environ, "HCS_RELEASE": "1", "HCS_DIST": str(dist)}
    print(sh("make", "-s", "package", "ARCH=arm64", cwd=REPO, env=env, timeout=1200))
    tree = dist / "tree"
    sh("dpkg-deb", "-x", dist / f"hcsd_{VERSION}_arm64.deb", tree)
    return {
        "deb": dist / f"hcsd_{VERSION}_arm64.deb",
        "rpm": dist / f"hcsd-{VERSION}.aarch64.rpm",
        "tree": tree,
    }


@pytest.fixture(scope="module")
def arm64_root() -> Path:
    need("debootstrap", "qemu-aarch64-static")
    try:
        out = sh(HERE / "make-arm64-root", CACHE, timeout=1200)
    except AssertionError as e:
        pytest.skip(f"SKIP: cannot build the Debian 12 arm64 root (mirror unreachable?): {e}")
    return Path(out.strip().splitlines()[-1])


def test_architecture_fields(arm64: dict[str, Path]) -> None:
    info = sh("dpkg-deb", "-f", arm64["deb"], "Architecture")
    assert info.strip() == "arm64"
    assert sh("rpm", "-qp", "--qf", "%{ARCH}", arm64["rpm"]).strip().endswith("aarch64")
    for name in ("deb", "rpm"):
        print(f"{arm64[name].name}: {arm64[name].stat().st_size} bytes")


def test_every_elf_is_aarch64_or_bpf(arm64: dict[str, Path]) -> None:
    """libhcs is AArch64, the eBPF objects BPF, and so is every extension module of every wheel:
    nothing x86-64 anywhere in the package (a wrong --platform would ship x86 wheels)."""
    tree = arm64["tree"]
    machines: dict[str, int] = {}
    for path in tree.rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        if path.suffix == ".whl":
            with zipfile.ZipFile(path) as wheel:
                for member in wheel.namelist():
                    machine = elf_machine(wheel.open(member).read(20))
                    if machine is not None:
                        machines[f"{path.name}:{member}"] = machine
        else:
            machine = elf_machine(path.read_bytes()[:20])
            if machine is not None:
                machines[str(path.relative_to(tree))] = machine
    assert machines["usr/lib/hcs/libhcs.so"] == EM_AARCH64
    assert machines["usr/lib/hcs/bpf/kmsg.bpf.o"] == machines["usr/lib/hcs/bpf/ras.bpf.o"] == EM_BPF
    in_wheels = {name: m for name, m in machines.items() if ".whl:" in name}
    assert len(in_wheels) >= 30, in_wheels  # grpcio, protobuf, msgpack, PyYAML, pydantic-core...
    wrong = {name: m for name, m in machines.items() if m not in (EM_AARCH64, EM_BPF)}
    assert not wrong, wrong
    print(f"{len(machines)} ELF files: {len(in_wheels)} in wheels, all AArch64 or BPF")


def test_lint_as_clean_as_amd64(arm64: dict[str, Path], packages: dict[str, Path]) -> None:
    """The same lintian tags and rpmlint findings as the amd64 packages (fixture of
    test_packages.py), the architecture aside."""
    if shutil.which("lintian"):

        def tags(deb: Path) -> list[str]:
            out = sh("lintian", deb, check=False)
            return sorted(line for line in out.splitlines() if re.match(r"[EWIP]: ", line))

        arm, amd = tags(arm64["deb"]), tags(packages["deb1"])
        assert not [line for line in arm if line.startswith("E:")], arm
        assert arm == amd
    if shutil.which("rpmlint"):

        def findings(rpm: Path, arch: str) -> list[str]:
            out = sh("rpmlint", "-c", "packaging/rpm/rpmlint.toml", rpm, check=False, cwd=REPO)
            lines = [line.replace(arch, "ARCH") for line in out.splitlines()]
            return sorted(re.sub(r"has taken [\d.]+ s", "", line) for line in lines)

        arm, amd = findings(arm64["rpm"], "aarch64"), findings(packages["rpm1"], "x86_64")
        assert any(" 0 errors" in line for line in arm), arm
        assert arm == amd


def test_wheelhouse_loads_in_arm64_python(arm64: dict[str, Path], arm64_root: Path,
                                          tmp_path: Path) -> None:  # fmt: skip
    """What install-venv would install, installed from the shipped wheelhouse alone (no index)
    for CPython 3.11 on aarch64, then imported by Debian 12's arm64 python3.11 under qemu:
    every extension module loads, and hcsd's daemon and cluster side import."""
    site = tmp_path / "site"
    sh(REPO / ".venv/bin/python", "-m", "pip", "install", "--quiet", "--no-index",
       "--find-links", arm64["tree"] / "usr/lib/hcs/wheels", "--target", site,
       "--only-binary=:all:", "--implementation", "cp", "--python-version", "3.11",
       "--platform", "manylinux_2_28_aarch64", "--platform", "manylinux_2_17_aarch64",
       "--platform", "manylinux2014_aarch64", "--platform", "any", "hcsd==0.1.0")  # fmt: skip
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    out = sh("qemu-aarch64-static", "-L", arm64_root, arm64_root / "usr/bin/python3.11",
             probe, site, timeout=600)  # fmt: skip
    print(out)
    line = next(line for line in out.splitlines() if line.startswith("PROBE"))
    _, machine, python, version, extensions = line.split()
    assert (machine, python[:4], version) == ("aarch64", "3.11", "0.1.0")
    assert int(extensions) >= 10  # grpc, protobuf's upb, msgpack, yaml, pydantic-core, aiohttp...


def test_packaged_libhcs_preloads_into_arm64_shell(
    arm64: dict[str, Path], arm64_root: Path
) -> None:
    """The stripped libhcs.so that ships, preloaded into the arm64 root's dash: nothing printed."""
    libhcs = arm64["tree"] / "usr/lib/hcs/libhcs.so"
    out = sh("env", f"LD_PRELOAD={libhcs}", "HCS_VRAM_QUOTA=1Gi", "qemu-aarch64-static", "-L",
             arm64_root, arm64_root / "bin/dash", "-c", "echo smoke")  # fmt: skip
    assert out == "smoke\n"


def test_ebpf_objects_pass_this_kernels_verifier(arm64: dict[str, Path], tmp_path: Path) -> None:
    """The packaged arm64 objects are the same bytes as the x86 ones (bpf/Makefile): BPF
    bytecode is the kernel's to JIT, so this x86 kernel's verifier judges them as an arm64
    kernel's would (minus kernel differences). Loaded into a private bpffs, gone with it."""
    need("bpftool", "unshare")
    if not Path("/sys/kernel/btf/vmlinux").exists():
        pytest.skip("SKIP: this kernel has no BTF (the CO-RE objects need it)")
    bpf = arm64["tree"] / "usr/lib/hcs/bpf"
    pins = tmp_path / "bpffs"
    pins.mkdir()
    script = (
        f"mount -t bpf bpf {pins}; for o in kmsg ras; do "
        f"bpftool prog loadall {bpf}/$o.bpf.o {pins}/$o; ls {pins}/$o; done"
    )
    out = sh("unshare", "--mount", "--propagation", "private", "sh", "-ec", script)
    assert out.split() == ["hcs_console", "hcs_aer", "hcs_mc"], out


def test_deb_install_run_purge_in_arm64_root(
    arm64: dict[str, Path], arm64_root: Path, tmp_path: Path
) -> None:
    """dpkg -i of the arm64 .deb in the configured arm64 root, every arm64 program (dpkg, the
    postinst, Debian's python3.11 building the venv from the wheelhouse, hcsd) emulated
    through binfmt_misc in a user namespace of its own (tests/e2e/in-arm64-userns)."""
    kind = (arm64_root / "hcs-root-kind").read_text().strip()
    if kind != "complete":
        pytest.skip(
            "SKIP: the arm64 root is only unpacked (this kernel gives no binfmt_misc to a user"
            " namespace, Linux >= 6.7): dpkg -i needs a configured root"
        )
    root = tmp_path / "root"
    sh("cp", "-a", arm64_root, root)
    try:
        shutil.copy(arm64["deb"], root / "tmp-hcsd.deb")
        (root / "hcs-install.sh").write_text(INSTALL)
        script = (
            f"mount --rbind /proc {root}/proc && mount --rbind /dev {root}/dev && "
            f"mount -t tmpfs tmpfs {root}/run && mount -t tmpfs tmpfs {root}/tmp && "
            "exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 "
            f"DEBIAN_FRONTEND=noninteractive chroot {root} /bin/sh -ex /hcs-install.sh"
        )
        out = sh(HERE / "in-arm64-userns", script, timeout=1800)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(out)
    assert "arm64\naarch64\n" in out
    assert "installed in /opt/hcsd/venv-0.1.0-1 with Python 3.11" in out
    assert "hcsd 0.1.0" in out and "hcs-syncer 0.1.0" in out and "VENV aarch64" in out
    assert "allocated" in out and "VENV-GONE" in out and "PURGED" in out
