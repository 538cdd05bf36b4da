"""The node's change feed: what a watcher receives, and its bounded queue.

A watcher that falls more than WATCH_QUEUE events behind is cut off (`WatchOverflow`) rather
than let the daemon's memory grow; it reconnects and gets a fresh initial state.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from hcsd.model import Allocation, Device, VramViolation

__all__ = ["WATCH_QUEUE", "DeviceStatus", "Event", "EventKind", "Subscription", "WatchOverflow"]

WATCH_QUEUE = 1024


class WatchOverflow(Exception):
    """A watcher fell more than WATCH_QUEUE events behind; it must reconnect and resync."""


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    device: Device
    vram_allocated: int
    compute_allocated: int
    allocations: int

    @property
    def vram_free(self) -> int:
        return max(self.device.vram_bytes - self.vram_allocated, 0)


class EventKind(enum.StrEnum):
    """What a watch event says; every kind here is published (a device the node loses is
    kept and reported LOST through DEVICE_CHANGED, so there is no removal event)."""

    INITIAL = "initial"  # part of the state at subscription (send_initial)
    SYNCED = "synced"  # the initial state is complete
    ALLOCATED = "allocated"
    RELEASED = "released"
    DEVICE_CHANGED = "device_changed"  # health, fingerprint, or what is allocated on it
    VRAM_OVER_QUOTA = "vram_over_quota"  # the VRAM watchdog found a container over its grant


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    seq: int
    time: float
    allocation: Allocation | None = None
    device: DeviceStatus | None = None
    violation: VramViolation | None = None


class Subscription:
    """One watcher's queue. Iterating yields events until the watcher is closed."""

    def __init__(self, on_close: Callable[[Subscription], None]) -> None:
        self._on_close = on_close
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=WATCH_QUEUE)
        self.overflowed = False

    def push(self, event: Event) -> None:
        if self.overflowed:
            return
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.overflowed = True
            self._queue.get_nowait()  # make room for the end marker
            self._queue.put_nowait(None)

    def close(self) -> None:
        self._on_close(self)

    async def __aiter__(self) -> AsyncIterator[Event]:
        try:
            while True:
                event = await self._queue.get()
                if event is None:
                    raise WatchOverflow(f"watcher fell more than {WATCH_QUEUE} events behind")
                yield event
        finally:
            self.close()
