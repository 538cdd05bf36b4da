"""RDMA ports in a sysfs tree laid out as the kernel lays it out (drivers/infiniband/core/sysfs.c).

`class/infiniband/<dev>` links to the device under the PCI function that carries it; each port
has `state` ("%d: %s"), `link_layer`, `rate`, the GID table `gids/<i>` (eight groups of four
hex digits) and, per GID, `gid_attrs/ndevs/<i>` (a netdev for RoCE; reading it fails with
EINVAL on an InfiniBand port, so the fake leaves it out there).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["FakePort", "make_rdma"]


@dataclass(frozen=True)
class FakePort:
    device: str
    number: int = 1
    link_layer: str = "InfiniBand"
    state: str = "4: ACTIVE"
    gid0: str = "fe80:0000:0000:0000:0002:c903:0031:7a51"
    rate: str = "200 Gb/sec (4X HDR)"
    ndev: str = ""  # gid_attrs/ndevs/0 (RoCE)
    net: str = ""  # device/net/<netdev>
    dev_port: str = ""  # device/net/<netdev>/dev_port (the port's number less one)
    pci: str = "0000:3b:00.0"


def make_rdma(sysfs: Path, ports: list[FakePort]) -> Path:
    for p in ports:
        device = sysfs / "devices/pci0000:00" / p.pci / "infiniband" / p.device
        port = device / "ports" / str(p.number)
        (port / "gids").mkdir(parents=True, exist_ok=True)
        (port / "gid_attrs/ndevs").mkdir(parents=True, exist_ok=True)
        for name, text in (("state", p.state), ("link_layer", p.link_layer), ("rate", p.rate),
                           ("phys_state", "5: LinkUp"), ("gids/0", p.gid0)):  # fmt: skip
            (port / name).write_text(text + "\n")
        if p.ndev:
            (port / "gid_attrs/ndevs/0").write_text(p.ndev + "\n")
        if p.net:
            net = sysfs / "devices/pci0000:00" / p.pci / "net" / p.net
            net.mkdir(parents=True)
            if p.dev_port:
                (net / "dev_port").write_text(p.dev_port + "\n")
        link = device / "device"
        if not link.is_symlink():
            link.symlink_to(Path("../.."))  # the PCI function the device hangs off
        entry = sysfs / "class/infiniband" / p.device
        entry.parent.mkdir(parents=True, exist_ok=True)
        if not entry.is_symlink():
            entry.symlink_to(device)
    return sysfs
