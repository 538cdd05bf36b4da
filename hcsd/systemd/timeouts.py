"""How long a restart may take, by the unit's own timeouts.

A restart job stops the unit and then starts it: systemd gives the stop TimeoutStopUSec and the
start TimeoutStartUSec (the Service interface, microseconds; UINT64_MAX is infinity, as CRI-O's
upstream unit sets with TimeoutStartSec=0). Waiting exactly systemd's default 90 s for the whole
restart would give up before systemd does; the wait is both phases plus a margin, or until the
job ends where either is infinite, unless the user set a limit of their own.
"""

from __future__ import annotations

from dbus_fast.aio import MessageBus

from hcsd.systemd.bus import PROPERTIES, SERVICE, SystemdError, call

__all__ = ["INFINITY", "MARGIN", "restart_wait"]

INFINITY = 2**64 - 1  # systemd's USEC_INFINITY
MARGIN = 15.0  # seconds past stop + start: systemd's own kill and bookkeeping after a timeout


async def restart_wait(bus: MessageBus, path: str, cap: float | None) -> float | None:
    """Seconds to wait for the restart of the unit at `path`; None: until its job ends. `cap`
    (the user's --restart-timeout) wins where given."""
    if cap is not None:
        return cap
    total = 0
    for name in ("TimeoutStopUSec", "TimeoutStartUSec"):
        try:
            (value,) = await call(bus, path, PROPERTIES, "Get", "ss", SERVICE, name)
        except SystemdError:  # not a service: systemd's default for both
            return 2 * 90.0 + MARGIN
        if int(value.value) == INFINITY:
            return None
        total += int(value.value)
    return total / 1e6 + MARGIN
