"""sd_notify messages: READY, STATUS, RELOADING, STOPPING and WATCHDOG pings.

Without NOTIFY_SOCKET (not under systemd) every call is a no-op.
"""

from __future__ import annotations

import functools
import os
import time

import sdnotify

from hcsd.daemon.logs import escape_controls

__all__ = ["failed", "ready", "reloading", "stopping", "watchdog", "watchdog_interval"]


@functools.cache
def _notifier(address: str) -> sdnotify.SystemdNotifier:
    """Connected on first use: NOTIFY_SOCKET is read when there is something to send."""
    return sdnotify.SystemdNotifier()


def _send(message: str) -> None:
    address = os.environ.get("NOTIFY_SOCKET")
    if address:
        _notifier(address).notify(message)


def ready(status: str) -> None:
    _send(f"READY=1\nSTATUS={status}")


def reloading() -> None:
    # MONOTONIC_USEC lets systemd (>= 253) match this reload to our next READY=1.
    _send(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")


def failed(reason: str) -> None:
    """Why hcsd gives up starting: systemd keeps the last STATUS after the process has exited,
    so `systemctl status hcsd` still shows it once the start limit has stopped the unit."""
    _send(f"STATUS=failed: {escape_controls(reason)}")


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
