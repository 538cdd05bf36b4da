"""The VRAM watchdog as the daemon builds it from its configuration.

One reader per vendor among the node's devices, with the libraries and sysfs root discovery
uses; grants from the ledger through the service; findings published on the API watch; libhcs's
own figures from the per-container directories under `daemon.run_dir`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from hcsd.daemon.config import Config
from hcsd.service import NodeService
from hcsd.watchdog import Policy, Tolerance, Watchdog, WatchdogSettings
from hcsd.watchdog.accounted import AccountedUsage
from hcsd.watchdog.readers import readers_for

__all__ = ["vram_watchdog"]

log = logging.getLogger(__name__)


def vram_watchdog(config: Config, service: NodeService) -> Watchdog | None:
    """The watchdog for this node; None when it is off or no device can be read per vendor."""
    if not config.watchdog_enabled:
        return None
    values = config.values
    readers = readers_for(
        [status.device for status in service.devices()],
        nvml_library=values.get("discovery.nvml_library", ""),
        dcmi_library=values.get("discovery.dcmi_library", "/usr/local/dcmi/libdcmi.so"),
        cndev_library=values.get("discovery.cndev_library", "/usr/local/neuware/lib64/libcndev.so"),
        sysfs=Path(values.get("discovery.sysfs", "/sys")),
    )
    if not readers:
        log.info("vram watchdog: off, no device of a vendor it can read")
        return None
    settings = WatchdogSettings(
        interval=config.watchdog_interval,
        policy=Policy(config.watchdog_policy),
        tolerance=Tolerance(config.watchdog_tolerance_percent, config.watchdog_process_overhead),
    )
    return Watchdog(
        readers,
        service.allocations,
        service.report_violation,
        settings,
        accounted=AccountedUsage(config.run_dir),
    )
