"""Reading the node's RDMA ports again while hcsd runs.

At boot an InfiniBand port sits in INIT or ARMED until the subnet manager sweeps the fabric,
which can take longer than hcsd takes to start; a cable or a subnet manager can also change
later. So the ports are read again every `RESCAN_SECONDS` (a few small sysfs files), and a
fabric that changed replaces the one `NodeService.fabric` reports (GetNode). hcs-syncer reads
GetNode on every hcsd event and at its resync (`resync`, 300 s by default), and writes the
ComputeNode's spec when it differs: a change reaches the ComputeNode within that time.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from hcsd.discovery.fabric import RESCAN_SECONDS, Fabric, discover_fabric
from hcsd.discovery.settings import DiscoverySection
from hcsd.service import NodeService

__all__ = ["fabric_at_start", "rescan_fabric", "watch_fabric"]

log = logging.getLogger(__name__)


def fabric_at_start(settings: DiscoverySection) -> Fabric:
    """The node's fabric as hcsd starts (`discovery.sysfs`, `discovery.fabric_domain`), logged."""
    fabric = discover_fabric(Path(settings.sysfs), settings.fabric_domain)
    log.info(
        "fabric domain: %s%s", fabric.domain or "none",
        f" ({fabric.source}, {len(fabric.ports)} active RDMA port(s))" if fabric.domain else "",
    )  # fmt: skip
    for note in fabric.notes:
        log.info("fabric: %s", note)
    return fabric


def rescan_fabric(service: NodeService, sysfs: Path, override: str = "") -> bool:
    """Read the ports again; True when the node's fabric changed (and is now the new one)."""
    found = discover_fabric(sysfs, override)
    before = service.fabric
    if found == before:
        return False
    service.set_fabric(found)
    if found.domain != before.domain:
        log.info("fabric domain: %s (was %s)", found.domain or "none", before.domain or "none")
    for note in found.notes:
        if note not in before.notes:
            log.info("fabric: %s", note)
    return True


async def watch_fabric(
    service: NodeService, settings: DiscoverySection, every: float = RESCAN_SECONDS
) -> None:
    """`rescan_fabric` of `discovery.sysfs` (with `discovery.fabric_domain`) every `every`
    seconds, until cancelled."""
    sysfs, override = Path(settings.sysfs), settings.fabric_domain
    while True:
        await asyncio.sleep(every)
        await asyncio.to_thread(rescan_fabric, service, sysfs, override)
