"""The contract of a health source: start feeding events to a callback, stop, report counts."""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable

from hcsd.health.events import HealthEvent

__all__ = ["Emit", "HealthSource", "SourceUnavailable"]

Emit = Callable[[HealthEvent], None]


class SourceUnavailable(Exception):
    """This source cannot run here; the message says why in one line."""


class HealthSource(abc.ABC):
    name = ""

    @abc.abstractmethod
    def start(self, loop: asyncio.AbstractEventLoop, emit: Emit) -> None:
        """Begin delivering events on `loop`; raise SourceUnavailable if it cannot."""

    @abc.abstractmethod
    def stop(self) -> None: ...

    def stats(self) -> dict[str, int]:
        """Counters for metrics: lines seen, matched, dropped (where the source knows)."""
        return {}
