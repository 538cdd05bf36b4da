"""systemd over its D-Bus API (org.freedesktop.systemd1(5)), with dbus-fast on the system bus.

`hcsctl setup` restarts the container runtime through it and waits until the unit is active
again; hcsd follows the runtime's unit so that its NRI plugin reconnects the moment the
runtime is back. Both work without it: a host or container with no systemd on a system bus
raises `SystemdUnavailable`, and the callers say what to do instead.
"""

from hcsd.systemd.bus import SystemdError, SystemdUnavailable, UnitState, unit_path
from hcsd.systemd.following import ActiveEdges, follow_units
from hcsd.systemd.restarting import (
    DENIED,
    NotRunning,
    RestartFailed,
    RestartPending,
    RestartUnknown,
    RestartWait,
    main_started,
    restart_unit,
)

__all__ = [
    "DENIED",
    "ActiveEdges",
    "NotRunning",
    "RestartFailed",
    "RestartPending",
    "RestartUnknown",
    "RestartWait",
    "SystemdError",
    "SystemdUnavailable",
    "UnitState",
    "follow_units",
    "main_started",
    "restart_unit",
    "unit_path",
]
