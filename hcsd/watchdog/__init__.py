"""The out-of-band VRAM watchdog: what the drivers say each container holds, against its grant.

libhcs enforces quotas inside the container's processes; anything that bypasses the preload
(a static binary, direct ioctls, an unset preload, a root tenant) is invisible to it. The
watchdog reads the vendors' own per-process figures from outside, charges them to containers
through their cgroups, and warns about (or kills) a container over its grant.

Modules, one job each: `usage` (the shapes), `readers/` (one per vendor interface), `cgroups`
(pid to container), `assessment` (the comparison), `killing` (SIGKILL within one container),
`accounted` (libhcs's own figure), `watchdog` (the poll loop), `metrics` (what it exposes).
"""

from hcsd.watchdog.assessment import Tolerance
from hcsd.watchdog.watchdog import Policy, PollResult, Watchdog, WatchdogSettings

__all__ = ["Policy", "PollResult", "Tolerance", "Watchdog", "WatchdogSettings"]
