"""Which RDMA fabric this node is on: its fabric domain, from the RDMA ports in sysfs.

The kernel lists every RDMA port under `class/infiniband/<device>/ports/<n>/`:
`link_layer` ("InfiniBand" or "Ethernet"), `state` ("4: ACTIVE" when the port carries
traffic), `rate` ("200 Gb/sec (4X HDR)"), and the GID table `gids/<i>`, printed as eight
groups of four hex digits. For InfiniBand, GID 0's upper 64 bits are the port's subnet
prefix, which the subnet manager assigns: nodes whose ports share a prefix are on one
subnet, so the domain is `ib:<prefix>` ("ib:fe80:0000:0000:0000"). A node whose active ports
are on several subnets (multi-rail) is named by all of them, sorted and joined with "/"
("ib:fec0:0000:0000:0001/fec0:0000:0000:0002"), or, past 64 characters, by a hash of that list
("ib:4-subnets-<20 hex digits>"): two nodes share a domain only when they reach the same set of
subnets, whichever port the kernel lists first. The default prefix
fe80:0000:0000:0000 is the same on every subnet whose manager was not given one: operators
set one per fabric in the subnet manager, or name the domain in `discovery.fabric_domain`.

Ethernet (RoCE) ports say nothing about which fabric they reach (GID 0 is link-local, from the
MAC address); their netdev (`gid_attrs/ndevs/0`, else the one under `device/net/` whose
`dev_port` is the port's number less one) is reported so that the operator can see them, and
the domain is whatever `discovery.fabric_domain` names.

A port in INIT or ARMED waits for the subnet manager's sweep (at boot, for a while): it is
not counted, a note says so, and hcsd reads sysfs again every `RESCAN_SECONDS`
(`hcsd.daemon.fabric_watch`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_PREFIX", "RESCAN_SECONDS", "Fabric", "Port", "discover_fabric", "read_ports"]

RESCAN_SECONDS = 30.0  # how often hcsd reads the ports again (a few small sysfs files)
DOMAIN_MAX = 64  # names.py: a fabric domain is at most 64 characters

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
    """The port's netdev: GID 0's, else the PCI function's netdev of the same port (its
    `dev_port` counts ports from 0); the only one when it says nothing; else ""."""
    found = _read(port / "gid_attrs" / "ndevs" / "0")
    if found:
        return found
    try:
        nets = sorted((device / "device" / "net").iterdir())
    except OSError:
        return ""
    wanted = str(int(port.name) - 1)
    for net in nets:
        if _read(net / "dev_port") == wanted:
            return net.name
    return nets[0].name if len(nets) == 1 else ""


def read_ports(sysfs: Path, waiting: list[str] | None = None) -> list[Port]:
    """The active RDMA ports, by device and port number; `waiting` gets "mlx5_0/1 INIT" for
    each port that waits for the subnet manager (INIT, ARMED)."""
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
            state = _read(port / "state")
            if not port.name.isdigit() or not state.startswith("4:"):
                if waiting is not None and state[:2] in ("2:", "3:"):
                    waiting.append(f"{device.name}/{port.name} {state[2:].strip()[:16]}")
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


def _domain(subnets: list[str]) -> str:
    """`ib:` and every subnet, sorted, joined with "/"; hashed when that is too long."""
    joined = "ib:" + "/".join(subnets)
    if len(joined) <= DOMAIN_MAX:
        return joined
    digest = hashlib.sha256(joined.encode()).hexdigest()[:20]
    return f"ib:{len(subnets)}-subnets-{digest}"


def discover_fabric(sysfs: Path, override: str = "") -> Fabric:
    """The node's fabric: `override` (`discovery.fabric_domain`) when set, else the subnets
    of its active InfiniBand ports (all of them, see the module's docstring)."""
    waiting: list[str] = []
    ports = tuple(read_ports(sysfs, waiting))
    notes: list[str] = []
    if waiting:
        notes.append(
            f"RDMA ports {', '.join(waiting[:8])} are not ACTIVE yet (the subnet manager has "
            f"not brought them up): read again every {RESCAN_SECONDS:.0f} s"
        )
    if override:
        return Fabric(override, "config", ports, tuple(notes))
    subnets = sorted({p.subnet for p in ports if p.subnet})
    ethernet = [p for p in ports if p.link_layer == "Ethernet"]
    if not subnets:
        if ethernet:
            named = ", ".join(f"{p.device}/{p.number} ({p.netdev or '?'})" for p in ethernet)
            notes.append(
                f"RoCE ports {named} do not say which fabric they reach: name it in "
                "discovery.fabric_domain"
            )
        elif not ports and not waiting:
            notes.append("no active RDMA port: the node has no fabric domain")
        return Fabric("", "", ports, tuple(notes))
    if len(subnets) > 1:
        notes.append(
            f"active InfiniBand ports on {len(subnets)} subnets ({', '.join(subnets[:8])}): "
            "the domain names them all, so it is shared only with nodes on the same subnets; "
            "set discovery.fabric_domain to group nodes otherwise"
        )
    if DEFAULT_PREFIX in subnets:
        notes.append(
            f"subnet prefix {DEFAULT_PREFIX} is every subnet manager's default: unless each "
            "fabric's subnet manager sets its own, separate fabrics look like one (set one, "
            "or discovery.fabric_domain)"
        )
    return Fabric(_domain(subnets), "infiniband", ports, tuple(notes))
