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

from hcsd.discovery.fabric import RESCAN_SECONDS, discover_fabric
from hcsd.service import NodeService

__all__ = ["rescan_fabric", "watch_fabric"]

log = logging.getLogger(__name__)


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
    service: NodeService, sysfs: Path, override: str = "", every: float = RESCAN_SECONDS
) -> None:
    """`rescan_fabric` every `every` seconds, until cancelled."""
    while True:
        await asyncio.sleep(every)
        await asyncio.to_thread(rescan_fabric, service, sysfs, override)
