"""sd_notify messages: READY, STATUS, RELOADING, STOPPING and WATCHDOG pings.

Without NOTIFY_SOCKET (not under systemd) every call is a no-op.
"""

from __future__ import annotations

import os
import time

import sdnotify

__all__ = ["ready", "reloading", "stopping", "watchdog", "watchdog_interval"]

_notifier = sdnotify.SystemdNotifier()


def _send(message: str) -> None:
    if os.environ.get("NOTIFY_SOCKET"):
        _notifier.notify(message)


def ready(status: str) -> None:
    _send(f"READY=1\nSTATUS={status}")


def reloading() -> None:
    # MONOTONIC_USEC lets systemd (>= 253) match this reload to our next READY=1.
    _send(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")


def stopping() -> None:
    _send("STOPPING=1\nSTATUS=stopping")


def watchdog(status: str) -> None:
    _send(f"WATCHDOG=1\nSTATUS={status}")


def watchdog_interval() -> float | None:
    """Half the watchdog timeout systemd set for us, or None when there is none."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2_000_000
