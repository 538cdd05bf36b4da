"""`hcsctl setup`'s restart of the container runtime through systemd, and what it prints.

Exit statuses: 0 restarted and active again (or no systemd here: the operator restarts it,
the configuration is written); 1 the restart was refused or failed, or systemd failed a call
before it; 3 the restart was requested but its outcome is unknown (the bus went away while it
ran); 4 the wait ended with systemd still working on the restart; 130 interrupted (Ctrl-C).
hcsd.systemd (and with it dbus-fast) is imported only when a restart is to be done.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

__all__ = ["PENDING", "UNKNOWN", "restart_runtime", "started_before"]

UNKNOWN = 3  # the restart was requested; how it ended is not known here
PENDING = 4  # the wait is over; systemd is still running the restart job


def restart_runtime(runtime: str, unit: str, timeout: float | None, *, restart: bool) -> int:
    """Restart the runtime through systemd and wait for it; say what to do where that cannot be."""
    if not restart:
        print(f"now restart {runtime}: systemctl restart {runtime}")
        return 0
    return _restart(runtime, unit, timeout)


def _restart(runtime: str, unit: str, timeout: float | None) -> int:
    from hcsd.systemd import (
        DENIED,
        NotRunning,
        RestartFailed,
        RestartPending,
        RestartUnknown,
        SystemdError,
        SystemdUnavailable,
        restart_unit,
    )

    print(f"restarting {unit} through systemd")
    try:
        seconds = asyncio.run(restart_unit(unit, timeout))
    except SystemdUnavailable as e:
        print(
            f"hcsctl: cannot restart {runtime} through systemd: {e}.\n"
            f"Restart {runtime} yourself, however it runs here, so that it reads the new "
            f"configuration (under systemd: systemctl restart {unit}).",
            file=sys.stderr,
        )
        return 0
    except SystemdError as e:
        hint = "; run as root (sudo)" if e.name in DENIED else ""
        print(f"hcsctl: cannot restart {unit} through systemd: {e}{hint}", file=sys.stderr)
        return 1
    except (RestartFailed, RestartUnknown, RestartPending) as e:
        failed = isinstance(e, RestartFailed)
        see = f"journalctl -u {unit}" if failed else f"systemctl status {unit}"
        print(f"hcsctl: {e}; see {see}", file=sys.stderr)
        return 1 if failed else UNKNOWN if isinstance(e, RestartUnknown) else PENDING
    except KeyboardInterrupt:
        print(
            f"\nhcsctl: interrupted; the restart of {unit} may already be under way: "
            f"systemctl status {unit}",
            file=sys.stderr,
        )
        return 130
    except NotRunning as e:  # stopped by the operator: left so
        print(e)
    else:
        print(f"{unit} is active again ({seconds:.1f} s)")
    return 0


def started_before(unit: str, files: list[Path]) -> Path | None:
    """The newest of `files` when the runtime's main process started before it was written
    (it runs without hcsd's configuration: an earlier restart failed or was skipped); None
    when it started after, or where systemd cannot say."""
    written = [(f.stat().st_mtime, f) for f in files if f.exists()]
    if not written:
        return None
    from hcsd.systemd import SystemdError, SystemdUnavailable, main_started

    try:
        started = asyncio.run(main_started(unit))
    except (SystemdUnavailable, SystemdError):
        return None
    mtime, newest = max(written)
    return newest if started is not None and started < mtime else None
