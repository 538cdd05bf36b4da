"""Logging helpers both the node daemon and the cluster side use.

A message repeated in a burst (a connection flood, a retry loop) is written at most `limit`
times per `interval`; the rest are counted and reported in one line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RepeatLimiter"]


@dataclass(slots=True)
class _Burst:
    started: float
    count: int = 1
    suppressed: int = 0


class RepeatLimiter(logging.Filter):
    """Let the same message through at most `limit` times per `interval` seconds.

    "The same" is the same logger, level and text. What is held back is counted, and one line
    says how many once the interval is over: with the message's next copy, or with whatever is
    logged next. Attach it to a handler; `emit` (the handler's `handle`) writes those lines.
    """

    def __init__(
        self,
        emit: Callable[[logging.LogRecord], object],
        *,
        limit: int = 10,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        max_tracked: int = 1024,
    ) -> None:
        super().__init__()
        self.emit = emit
        self.limit = limit
        self.interval = interval
        self.clock = clock
        self.max_tracked = max_tracked
        self._bursts: dict[tuple[str, int, str], _Burst] = {}
        self._next_sweep = 0.0
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, record.getMessage())
        with self._lock:  # handlers call filters outside their own lock
            now = self.clock()
            ended = []
            if now >= self._next_sweep or len(self._bursts) >= self.max_tracked:
                ended = self._sweep(now)
            burst = self._bursts.get(key)
            if burst is None:
                self._bursts[key] = _Burst(now)
                passed = True
            else:
                burst.count += 1
                passed = burst.count <= self.limit
                burst.suppressed += not passed
        for summary in ended:
            self.emit(summary)
        return passed

    def _sweep(self, now: float) -> list[logging.LogRecord]:
        """Close bursts older than the interval; returns the lines reporting what they held."""
        self._next_sweep = now + min(1.0, self.interval)
        summaries = []
        for key, burst in list(self._bursts.items()):
            if now - burst.started >= self.interval or len(self._bursts) >= self.max_tracked:
                del self._bursts[key]
                if burst.suppressed:
                    summaries.append(_summary(key, burst, now))
        return summaries


def _summary(key: tuple[str, int, str], burst: _Burst, now: float) -> logging.LogRecord:
    name, level, text = key
    return logging.LogRecord(
        name,
        level,
        __file__,
        0,
        "suppressed %d repeat(s) in %.0fs of: %s",
        (burst.suppressed, now - burst.started, text),
        None,
    )
