"""Fakes that follow the vendors' real interfaces: C management libraries, sysfs and /dev trees.

The C fakes (fake_nvml.c, fake_dcmi.c, fake_cndev.c) are built by tests/fakes/Makefile into
tests/fakes/build/ and read a config file written by `write_config`; the trees are made under a
temporary directory, with real character device nodes (os.mknod) so that stat sees what it
sees on a host.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build"

__all__ = ["BUILD", "Function", "build_fakes", "make_devfs", "make_sysfs", "write_config"]


def build_fakes() -> Path | None:
    """Build the fake libraries; None when this machine has no C compiler."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        return None
    subprocess.run(["make", "-s", "-C", str(HERE)], check=True)
    return BUILD


def write_config(path: Path, records: Iterable[tuple[str, Mapping[str, object]]]) -> Path:
    """One line per record: `kind key=value ...`, values with spaces quoted."""
    lines = []
    for kind, values in records:
        pairs = [f'{k}="{v}"' if " " in str(v) else f"{k}={v}" for k, v in values.items()]
        lines.append(" ".join([kind, *pairs]))
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass(frozen=True)
class Function:
    """One PCI function in a fake sysfs."""

    address: str
    vendor: int
    device: int
    class_code: int = 0x030200
    numa_node: int = 0
    speed: str = "16.0 GT/s PCIe"
    width: int = 16
    driver: str = ""
    extra: Mapping[str, str] | None = None


def make_sysfs(root: Path, functions: Iterable[Function]) -> Path:
    """`root/bus/pci/devices/<address>/...` with the attributes discovery reads."""
    devices = root / "bus" / "pci" / "devices"
    devices.mkdir(parents=True, exist_ok=True)
    for f in functions:
        path = devices / f.address
        path.mkdir(parents=True, exist_ok=True)
        files = {
            "vendor": f"0x{f.vendor:04x}",
            "device": f"0x{f.device:04x}",
            "class": f"0x{f.class_code:06x}",
            "numa_node": str(f.numa_node),
            "current_link_speed": f.speed,
            "current_link_width": str(f.width),
            "max_link_speed": f.speed,
            "max_link_width": str(f.width),
            **(f.extra or {}),
        }
        for name, text in files.items():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_text(text + "\n")
        if f.driver:
            drivers = root / "bus" / "pci" / "drivers" / f.driver
            drivers.mkdir(parents=True, exist_ok=True)
            link = path / "driver"
            if not link.is_symlink():
                link.symlink_to(drivers)
    return root


def make_devfs(root: Path, nodes: Mapping[str, tuple[int, int]]) -> Path:
    """Character device nodes `name -> (major, minor)` under root (needs root or CAP_MKNOD)."""
    import stat

    for name, (major, minor) in nodes.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(major, minor))
    return root
