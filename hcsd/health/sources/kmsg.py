"""Polling fallback: read /dev/kmsg records as they arrive (no eBPF needed).

Starts at the end of the log: faults printed before hcsd started were acted on (or not) by the
previous run, and replaying them would mark healthy devices unhealthy again. A record cheaper
to skip than to parse is skipped before any regular expression: one written from user space
(not the kernel's facility), or one without a vendor's marker where that vendor puts it (the
eBPF filter's table, hcsd.contract.kmsg_needles).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import time
from collections.abc import Sequence

from hcsd.contract.kmsg_needles import needle_of
from hcsd.health.parsing import DEFAULT_RULES, LineRule, kmsg_text, parse_kernel_line
from hcsd.health.sources.base import Emit, HealthSource, SourceUnavailable

__all__ = ["KmsgSource"]

READ_SIZE = 8192  # one record per read(); the kernel caps a record well below this


class KmsgSource(HealthSource):
    name = "kmsg"

    def __init__(self, path: str = "/dev/kmsg", rules: Sequence[LineRule] = DEFAULT_RULES) -> None:
        self.path = path
        self.rules = rules
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self.seen = self.matched = self.lost = 0

    def start(self, loop: asyncio.AbstractEventLoop, emit: Emit) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise SourceUnavailable(f"cannot read {self.path}: {e.strerror}") from e
        with contextlib.suppress(OSError):  # a plain file (tests) reads from its start
            os.lseek(fd, 0, os.SEEK_END)
        self._fd = fd
        self._loop = loop
        loop.add_reader(fd, self._drain, emit)

    def _drain(self, emit: Emit) -> None:
        while True:
            try:
                record = os.read(self._fd, READ_SIZE)
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno == errno.EPIPE:  # the ring overwrote records we had not read
                    self.lost += 1
                    continue
                raise
            if not record:
                return
            self.seen += 1
            text = kmsg_text(record)
            if text is None or not needle_of(text):
                continue
            event = parse_kernel_line(text, time.monotonic(), source="kmsg", rules=self.rules)
            if event is not None:
                self.matched += 1
                emit(event)

    def stop(self) -> None:
        if self._fd >= 0:
            if self._loop is not None:
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def stats(self) -> dict[str, int]:
        return {"seen": self.seen, "matched": self.matched, "dropped": self.lost}
