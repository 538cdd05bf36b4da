"""The VRAM watchdog as the daemon builds it from `[watchdog]`.

One reader per vendor among the node's devices, with the libraries and sysfs root of
`[discovery]`; grants from the ledger through the service; findings published on the API
watch; libhcs's own figures from the per-container directories under `daemon.run_dir`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from hcsd.discovery.settings import DiscoverySection
from hcsd.service import NodeService
from hcsd.watchdog import Watchdog
from hcsd.watchdog.accounted import AccountedUsage
from hcsd.watchdog.readers import readers_for
from hcsd.watchdog.settings import WatchdogSection

__all__ = ["vram_watchdog"]

log = logging.getLogger(__name__)


def vram_watchdog(
    settings: WatchdogSection,
    discovery: DiscoverySection,
    service: NodeService,
    run_dir: str,
    members: Callable[[], Mapping[str, str]] | None = None,
) -> Watchdog | None:
    """The watchdog for this node; None when it is off or no device can be read per vendor.
    `members`: the containers of DRA claims, as the NRI plugin linked them."""
    if not settings.enabled:
        return None
    readers = readers_for([status.device for status in service.devices()], discovery)
    if not readers:
        log.info("vram watchdog: off, no device of a vendor it can read")
        return None
    return Watchdog(
        readers,
        service.allocations,
        service.report_violation,
        settings.watchdog_settings(),
        accounted=AccountedUsage(run_dir),
        members=members,
    )
