"""Which RDMA fabric this node is on: its fabric domain, from the RDMA ports in sysfs.

The kernel lists every RDMA port under `class/infiniband/<device>/ports/<n>/`:
`link_layer` ("InfiniBand" or "Ethernet"), `state` ("4: ACTIVE" when the port carries
traffic), `rate` ("200 Gb/sec (4X HDR)"), and the GID table `gids/<i>`, printed as eight
groups of four hex digits. For InfiniBand, GID 0's upper 64 bits are the port's subnet
prefix, which the subnet manager assigns: nodes whose ports share a prefix are on one
subnet, so the domain is `ib:<prefix>` ("ib:fe80:0000:0000:0000"). The default prefix
fe80:0000:0000:0000 is the same on every subnet whose manager was not given one: operators
set one per fabric in the subnet manager, or name the domain in `discovery.fabric_domain`.

Ethernet (RoCE) ports say nothing about which fabric they reach (GID 0 is link-local, from the
MAC address); their netdev (`gid_attrs/ndevs/0`, else `device/net/`) is reported so that the
operator can see them, and the domain is whatever `discovery.fabric_domain` names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_PREFIX", "Fabric", "Port", "discover_fabric", "read_ports"]

DEFAULT_PREFIX = "fe80:0000:0000:0000"  # what every subnet manager uses unless told otherwise
_GID = re.compile(r"[0-9a-f]{4}(:[0-9a-f]{4}){7}")
_ZERO_PREFIX = "0000:0000:0000:0000"


@dataclass(frozen=True, slots=True)
class Port:
    """One active RDMA port."""

    device: str  # mlx5_0
    number: int
    link_layer: str  # InfiniBand, Ethernet
    rate: str  # as the kernel says it: "200 Gb/sec (4X HDR)"
    subnet: str = ""  # InfiniBand: GID 0's subnet prefix
    netdev: str = ""  # Ethernet: the network interface

    def describe(self) -> str:
        """One line for the ComputeNode and `hcsctl status`."""
        where = f"subnet {self.subnet}" if self.subnet else f"netdev {self.netdev or '?'}"
        return f"{self.device}/{self.number} {self.link_layer} {self.rate or '?'} {where}"


@dataclass(frozen=True, slots=True)
class Fabric:
    """The node's fabric domain ("" when unknown), where it comes from, and what was seen."""

    domain: str = ""
    source: str = ""  # "config" or "infiniband"; "" with no domain
    ports: tuple[Port, ...] = ()
    notes: tuple[str, ...] = ()  # what an operator should know (default prefix, RoCE, …)


def _read(path: Path) -> str:
    """An attribute's text, "" when it is absent or the kernel refuses it (`gid_attrs/ndevs`
    of an InfiniBand port answers EINVAL)."""
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _subnet(gid: str) -> str:
    """The subnet prefix (the upper four groups) of a GID as sysfs prints it; "" if none."""
    gid = gid.lower()
    if not _GID.fullmatch(gid):
        return ""
    prefix = gid[:19]
    return "" if prefix == _ZERO_PREFIX else prefix


def _netdev(device: Path, port: Path) -> str:
    found = _read(port / "gid_attrs" / "ndevs" / "0")
    if found:
        return found
    try:
        return sorted(p.name for p in (device / "device" / "net").iterdir())[0]
    except (OSError, IndexError):
        return ""


def read_ports(sysfs: Path) -> list[Port]:
    """The active RDMA ports, by device and port number."""
    root = sysfs / "class" / "infiniband"
    try:
        devices = sorted(root.iterdir())
    except OSError:
        return []
    found = []
    for device in devices:
        try:
            ports = sorted((device / "ports").iterdir(), key=lambda p: p.name)
        except OSError:
            continue
        for port in ports:
            if not port.name.isdigit() or not _read(port / "state").startswith("4:"):
                continue  # DOWN, INIT, ARMED: carries no traffic now
            layer = _read(port / "link_layer")
            ib = layer == "InfiniBand"
            found.append(
                Port(
                    device=device.name,
                    number=int(port.name),
                    link_layer=layer or "Unknown",
                    rate=_read(port / "rate"),
                    subnet=_subnet(_read(port / "gids" / "0")) if ib else "",
                    netdev="" if ib else _netdev(device, port),
                )
            )
    return found


def discover_fabric(sysfs: Path, override: str = "") -> Fabric:
    """The node's fabric: `override` (`discovery.fabric_domain`) when set, else the subnet of
    its active InfiniBand ports (the lowest prefix when they are on several)."""
    ports = tuple(read_ports(sysfs))
    if override:
        return Fabric(override, "config", ports)
    subnets = sorted({p.subnet for p in ports if p.subnet})
    ethernet = [p for p in ports if p.link_layer == "Ethernet"]
    notes: list[str] = []
    if not subnets:
        if ethernet:
            named = ", ".join(f"{p.device}/{p.number} ({p.netdev or '?'})" for p in ethernet)
            notes.append(
                f"RoCE ports {named} do not say which fabric they reach: name it in "
                "discovery.fabric_domain"
            )
        elif not ports:
            notes.append("no active RDMA port: the node has no fabric domain")
        return Fabric("", "", ports, tuple(notes))
    if len(subnets) > 1:
        notes.append(
            f"active InfiniBand ports on {len(subnets)} subnets ({', '.join(subnets)}): the "
            "lowest names the domain; set discovery.fabric_domain to choose"
        )
    if subnets[0] == DEFAULT_PREFIX:
        notes.append(
            f"subnet prefix {DEFAULT_PREFIX} is every subnet manager's default: unless each "
            "fabric's subnet manager sets its own, separate fabrics look like one (set one, "
            "or discovery.fabric_domain)"
        )
    return Fabric(f"ib:{subnets[0]}", "infiniband", ports, tuple(notes))
