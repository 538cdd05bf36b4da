"""The contract of a health source: start feeding events to a callback, stop, report counts."""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable

from hcsd.health.events import HealthEvent

__all__ = ["CANDIDATE_NEEDLES", "Emit", "HealthSource", "SourceUnavailable"]

Emit = Callable[[HealthEvent], None]

# The same substrings the eBPF filter uses: a line without one of them is never ours.
CANDIDATE_NEEDLES = (
    b"NVRM: Xid",
    b"amdgpu",
    b"AER:",
    b"davinci",
    b"devdrv",
    b"cambricon",
    b"cndrv",
)


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
