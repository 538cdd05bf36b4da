"""`[watchdog]`: whether the VRAM watchdog runs, how often, how much beyond a grant it lets
pass, and what it does to a container over the line. The poll settings are derived from this
section in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hcsd.quantity import QuantityError, parse_bytes
from hcsd.sections import Section, checks, setting
from hcsd.watchdog.assessment import Tolerance
from hcsd.watchdog.watchdog import Policy, WatchdogSettings

__all__ = ["WatchdogSection"]


def _bytes(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value  # already bytes (a section built in code)
    if not isinstance(value, str):
        raise ValueError
    try:
        return parse_bytes(value)
    except QuantityError as e:
        raise ValueError(f'expected a quantity such as "512Mi": {e}') from None


quantity = checks.Check('a quantity such as "512Mi"', _bytes)


@dataclass(frozen=True, slots=True)
class WatchdogSection(Section):
    """The VRAM watchdog: on or off, its interval, its tolerance and its policy."""

    enabled: bool = setting(
        True,
        "Compare each container's device memory, as the vendor's driver reports it per "
        "process, with its grant (NVML, KFD sysfs, DCMI, CNDev; see docs/libhcs.md).",
        checks.boolean,
    )
    interval: float = setting(5.0, "Seconds between watchdog polls.", checks.seconds)
    policy: Policy = setting(
        Policy.WARN,
        "warn: log, count and publish a container over its grant; kill: also SIGKILL every "
        "process of it.",
        checks.enum(Policy),
    )
    tolerance_percent: float = setting(
        5.0,
        "Share of the grant a container may exceed (allocator rounding, library pools).",
        checks.percent,
    )
    process_overhead: int = setting(
        2**30,
        "Device memory each process may hold beyond its grant: the CUDA context and loaded "
        "modules no allocation call returns, so libhcs cannot charge them (518Mi for a bare "
        "context, 586Mi for PyTorch on an H100; 1.7Gi with CUDA_MODULE_LOADING=EAGER).",
        quantity,
        as_written="1Gi",
    )

    def tolerance(self) -> Tolerance:
        return Tolerance(self.tolerance_percent, self.process_overhead)

    def watchdog_settings(self) -> WatchdogSettings:
        return WatchdogSettings(
            interval=self.interval, tolerance=self.tolerance(), policy=self.policy
        )
