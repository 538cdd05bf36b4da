"""A fake NVIDIA driver in a directory used as a host root: real ELF shared objects built with
gcc (each with its soname) and a real ld.so cache written by the system's `ldconfig -r`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

VERSION = "550.54.15"
LIB_DIR = "usr/lib/x86_64-linux-gnu"
# file name stem -> soname major, as the driver installs them
LIBRARIES = {"libcuda.so": "1", "libnvidia-ml.so": "1", "libnvidia-ptxjitcompiler.so": "1"}


def tools() -> tuple[str, str]:
    """gcc and ldconfig, or a skip naming the one missing."""
    gcc = shutil.which("gcc")
    ldconfig = shutil.which("ldconfig") or shutil.which("ldconfig", path="/sbin:/usr/sbin")
    if gcc is None or ldconfig is None:
        pytest.skip("building a fake driver needs gcc and ldconfig")
    return gcc, ldconfig


def shared_object(path: Path, soname: str, symbol: str = "cuInit") -> None:
    """A real shared object at `path` with `soname`, exporting `symbol`."""
    gcc, _ = tools()
    source = path.parent / f".{path.name}.c"
    source.write_text(f"int {symbol}(int flags) {{ return flags; }}\n")
    subprocess.run(
        [gcc, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path), str(source)],
        check=True,
        capture_output=True,
    )
    source.unlink()
    path.chmod(0o755)  # whatever the umask: hcsd refuses driver files others may write


def update_cache(root: Path, *directories: str) -> Path:
    """Run the real ldconfig over `directories` of `root` (soname links and the cache)."""
    _, ldconfig = tools()
    directory(root / "etc")
    (root / "etc/ld.so.conf").write_text("".join(f"/{d}\n" for d in directories or (LIB_DIR,)))
    subprocess.run(
        [ldconfig, "-r", str(root), "-f", "/etc/ld.so.conf", "-C", "/etc/ld.so.cache"],
        check=True,
        capture_output=True,
    )
    return root / "etc/ld.so.cache"


def fake_driver(root: Path, *, smi: bool = True, firmware: bool = True) -> Path:
    """The driver's libraries in root/usr/lib/x86_64-linux-gnu, nvidia-smi in root/usr/bin,
    GSP firmware in root/lib/firmware/nvidia/VERSION; the cache's path."""
    libs = root / LIB_DIR
    directory(libs)
    for stem, major in LIBRARIES.items():
        shared_object(libs / f"{stem}.{VERSION}", f"{stem}.{major}")
    if smi:
        directory(root / "usr/bin")
        (root / "usr/bin/nvidia-smi").write_text("#!/bin/sh\necho fake nvidia-smi\n")
        (root / "usr/bin/nvidia-smi").chmod(0o755)
    if firmware:
        directory(root / f"lib/firmware/nvidia/{VERSION}")
        (root / f"lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin").write_bytes(b"\0" * 64)
    return update_cache(root)


def directory(path: Path) -> None:
    """`path` and its missing parents, mode 0755 whatever the umask (hcsd refuses a directory
    on the way that group or others may write); the parents up to the fake root's parent."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    for created in missing:
        created.chmod(0o755)
