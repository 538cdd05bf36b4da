"""PCI ground truth: which accelerators sit on the bus, their NUMA node and PCIe link.

Vendor libraries say what a device is; sysfs says where it is. Every backend reads the same
attributes here, by bus address, so NUMA placement and link figures mean the same for every
vendor. On the live system the function list comes from udev (pyudev), which sees what the
kernel sees; under another root (tests, a chroot) the same files are walked directly, since
libudev only ever reads /sys.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from hcsd.model import Vendor

__all__ = ["VENDOR_IDS", "PciFunction", "normalise_address", "read_function", "scan"]

VENDOR_IDS = {
    0x10DE: Vendor.NVIDIA,
    0x19E5: Vendor.ASCEND,
    0x1D94: Vendor.HYGON,
    0xCABC: Vendor.CAMBRICON,
}
# Display controllers (0x03), processing accelerators (0x12) and co-processors (0x0b40). The
# class filter matters: Huawei's id also names NICs and Hygon's names the CPU's host bridges.
_ACCELERATOR_CLASSES = (0x03, 0x12)
_COPROCESSOR = 0x0B40
_ADDRESS = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def normalise_address(text: str) -> str:
    """`0000:3b:00.0`, whatever the spelling (NVML writes `00000000:3B:00.0`)."""
    match = _ADDRESS.match(text.strip())
    if match is None:
        raise ValueError(f"not a PCI address: {text!r}")
    domain, bus, device, function = match.groups()
    domain_value = int(domain or "0", 16)
    if domain_value > 0xFFFF:
        raise ValueError(f"PCI domain out of range in {text!r}")
    return f"{domain_value:04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


@dataclass(frozen=True, slots=True)
class PciFunction:
    address: str
    vendor: Vendor | None
    vendor_id: int
    device_id: int
    class_code: int
    numa_node: int = -1
    link_speed: float = 0.0  # GT/s, current
    link_width: int = 0
    max_link_speed: float = 0.0
    max_link_width: int = 0
    driver: str = ""
    # The upstream port's own maxima (the bridge the link trains against): a Gen5 card in a
    # Gen4 slot, an x16 card in an x8-wired slot, a VM's root port. 0 where not known.
    port_max_link_speed: float = 0.0
    port_max_link_width: int = 0

    @property
    def link_cap_speed(self) -> float:
        """The fastest the link can train: the lower of both ends' maxima."""
        return _lower(self.max_link_speed, self.port_max_link_speed)

    @property
    def link_cap_width(self) -> int:
        """The widest the link can train: the lower of both ends' maxima."""
        return int(_lower(self.max_link_width, self.port_max_link_width))

    @property
    def is_accelerator(self) -> bool:
        return self.vendor is not None and (
            self.class_code >> 16 in _ACCELERATOR_CLASSES or self.class_code >> 8 == _COPROCESSOR
        )

    @property
    def link_gbps(self) -> float:
        """Usable GB/s one direction of the current link (8b/10b up to 5 GT/s, then 128b/130b)."""
        efficiency = 0.8 if self.link_speed <= 5.0 else 128 / 130
        return round(self.link_speed * self.link_width * efficiency / 8, 2)

    def attributes(self) -> tuple[tuple[str, str], ...]:
        if not self.link_width:
            return ()
        return (
            ("pcie_link", f"{self.link_speed:g} GT/s x{self.link_width}"),
            ("pcie_max_link", f"{self.max_link_speed:g} GT/s x{self.max_link_width}"),
        )


def read_function(sysfs: Path, address: str) -> PciFunction | None:
    """The function at `address`, or None when sysfs has no such device."""
    path = sysfs / "bus" / "pci" / "devices" / normalise_address(address)
    return _read(path) if path.is_dir() else None


def scan(sysfs: Path) -> list[PciFunction]:
    """Every accelerator of a known vendor on the bus, by address."""
    found = []
    for path in _function_paths(sysfs):
        try:
            function = _read(path)
        except (OSError, ValueError):
            continue  # a function that vanished or is half-written is not ours to report
        if function.is_accelerator:
            found.append(function)
    return sorted(found, key=lambda f: f.address)


def _function_paths(sysfs: Path) -> list[Path]:
    if os.path.realpath(sysfs) == "/sys":
        import pyudev

        context = pyudev.Context()
        return [Path(d.sys_path) for d in context.list_devices(subsystem="pci")]
    root = sysfs / "bus" / "pci" / "devices"
    return sorted(root.iterdir()) if root.is_dir() else []


def _read(path: Path) -> PciFunction:
    vendor_id = _hex(path / "vendor")
    driver = path / "driver"
    port_speed, port_width = _upstream_port(path)
    return PciFunction(
        address=normalise_address(path.name),
        vendor=VENDOR_IDS.get(vendor_id),
        vendor_id=vendor_id,
        device_id=_hex(path / "device"),
        class_code=_hex(path / "class"),
        numa_node=_int(path / "numa_node", -1),
        link_speed=_speed(path / "current_link_speed"),
        link_width=_int(path / "current_link_width", 0),
        max_link_speed=_speed(path / "max_link_speed"),
        max_link_width=_int(path / "max_link_width", 0),
        driver=os.path.basename(os.readlink(driver)) if driver.is_symlink() else "",
        port_max_link_speed=port_speed,
        port_max_link_width=port_width,
    )


def _upstream_port(path: Path) -> tuple[float, int]:
    """The maxima of the port the function's link trains against: its parent in the device
    tree (/sys/bus/pci/devices/<address> links into /sys/devices/pci…/<bridge>/<address>),
    walking further up past bridges that do not say (no link attributes) while the parent is
    still a PCI function. (0.0, 0) at the root complex or when nothing says."""
    parent = Path(os.path.realpath(path)).parent
    while _ADDRESS.match(parent.name):
        speed, width = _speed(parent / "max_link_speed"), _int(parent / "max_link_width", 0)
        if speed or width:
            return speed, width
        parent = parent.parent
    return 0.0, 0


def _lower(own: float, port: float) -> float:
    return min(own, port) if own and port else own


def _hex(path: Path) -> int:
    text = path.read_text().strip()
    try:
        return int(text, 16)
    except ValueError:
        raise ValueError(f"{path}: expected a hex number, got {text[:40]!r}") from None


def _int(path: Path, default: int) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return default


def _speed(path: Path) -> float:
    """`16.0 GT/s PCIe` (kernels since 5.x) or `8 GT/s`; 0.0 when absent or unknown."""
    try:
        match = re.match(r"\s*([0-9.]+)\s*GT/s", path.read_text())
    except OSError:
        return 0.0
    return float(match.group(1)) if match else 0.0
