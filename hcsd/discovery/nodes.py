"""Device nodes as the container runtime must create them: type, major and minor from stat.

Majors of the Ascend, Hygon and Cambricon drivers are dynamic, so nothing here is assumed:
every node is stat'ed under the configured device root, and reported with its path inside the
container (`/dev/...`), which is where the runtime creates it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from hcsd.discovery.backend import DiscoveryError
from hcsd.model import DeviceNode

__all__ = ["device_node", "existing_nodes", "glob_nodes"]


def device_node(dev_root: Path, name: str) -> DeviceNode:
    """The node `name` (relative to the device root, e.g. `nvidia0` or `dri/renderD128`)."""
    path = dev_root / name
    try:
        info = os.stat(path)
    except OSError as e:
        raise DiscoveryError(f"failed to stat device node {path}: {e.strerror}") from e
    if stat.S_ISCHR(info.st_mode):
        kind = "c"
    elif stat.S_ISBLK(info.st_mode):
        kind = "b"
    else:
        raise DiscoveryError(f"{path} is not a device node")
    return DeviceNode(
        path=f"/dev/{name}", major=os.major(info.st_rdev), minor=os.minor(info.st_rdev), kind=kind
    )


def existing_nodes(dev_root: Path, names: Iterable[str]) -> tuple[DeviceNode, ...]:
    """The nodes among `names` that exist; the rest are optional and skipped."""
    nodes = []
    for name in names:
        try:
            nodes.append(device_node(dev_root, name))
        except DiscoveryError:
            continue
    return tuple(nodes)


def glob_nodes(dev_root: Path, pattern: str) -> tuple[DeviceNode, ...]:
    """Nodes matching a glob under the device root, in name order."""
    names = sorted(str(p.relative_to(dev_root)) for p in dev_root.glob(pattern))
    return existing_nodes(dev_root, names)
