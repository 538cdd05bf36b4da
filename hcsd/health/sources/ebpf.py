"""Health events from HCS's own eBPF programs (bpf/kmsg.bpf.c, bpf/ras.bpf.c) via libbpf."""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import time
from collections.abc import Sequence

from hcsd.contract.kmsg_needles import message_start
from hcsd.health.events import HealthEvent, Severity
from hcsd.health.parsing import DEFAULT_RULES, LineRule, parse_kernel_line
from hcsd.health.sources.base import Emit, HealthSource, SourceUnavailable
from hcsd.health.sources.libbpf import BpfError, BpfObject

__all__ = ["KMSG_EVENT", "RAS_EVENT", "EbpfSource", "decode_ras"]

log = logging.getLogger(__name__)

# Mirrors of bpf/kmsg.h and bpf/ras.h; tests compare them with the C layout.
KMSG_EVENT = struct.Struct("<QIHH256s")
RAS_EVENT = struct.Struct("<QIIII32s")
AER_SEVERITY = {0: Severity.DEGRADING, 1: Severity.FATAL, 2: Severity.CORRECTABLE}
AER_CODE = {0: "aer-nonfatal", 1: "aer-fatal", 2: "aer-correctable"}


class EbpfSource(HealthSource):
    name = "ebpf"

    def __init__(self, bpf_dir: str, rules: Sequence[LineRule] = DEFAULT_RULES) -> None:
        self.bpf_dir = bpf_dir
        self.rules = rules
        self._objects: list[BpfObject] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fds: list[int] = []
        self.decode_errors = 0
        self.has_aer = False

    def start(self, loop: asyncio.AbstractEventLoop, emit: Emit) -> None:
        self._loop = loop
        try:
            kmsg = BpfObject(os.path.join(self.bpf_dir, "kmsg.bpf.o"), ["hcs_console"])
            kmsg.load()
            self._objects.append(kmsg)
            self._watch(kmsg, kmsg.open_ring(lambda data: self._on_kmsg(data, emit)))
            ras = BpfObject(
                os.path.join(self.bpf_dir, "ras.bpf.o"),
                ["hcs_aer", "hcs_mc"],
                optional={"hcs_aer": "aer_event", "hcs_mc": "mc_event"},
            )
            ras.load()
            self._objects.append(ras)
            self.has_aer = "hcs_aer" in ras.attached
            self._watch(ras, ras.open_ring(lambda data: self._on_ras(data, emit)))
        except BpfError as e:
            self.stop()
            raise SourceUnavailable(str(e)) from e

    def _watch(self, obj: BpfObject, fd: int) -> None:
        assert self._loop is not None
        self._loop.add_reader(fd, obj.consume)
        self._fds.append(fd)

    def _on_kmsg(self, data: bytes, emit: Emit) -> None:
        if len(data) < KMSG_EVENT.size:
            self.decode_errors += 1
            return
        _, length, _, _, raw = KMSG_EVENT.unpack_from(data)
        text = raw[: min(length, len(raw))].split(b"\0", 1)[0]
        text = text[message_start(text) :]  # console text on kernels before 6.0: "[time] "
        event = parse_kernel_line(text, time.monotonic(), source="ebpf", rules=self.rules)
        if event is not None:
            emit(event)

    def _on_ras(self, data: bytes, emit: Emit) -> None:
        event = decode_ras(data, time.monotonic())
        if event is None:
            self.decode_errors += 1
        else:
            emit(event)

    def stop(self) -> None:
        if self._loop is not None:
            for fd in self._fds:
                self._loop.remove_reader(fd)
        self._fds.clear()
        for obj in self._objects:
            obj.close()
        self._objects.clear()

    def stats(self) -> dict[str, int]:
        seen = matched = dropped = 0
        for obj in self._objects:
            s, m, d = obj.counters()
            seen, matched, dropped = seen + s, matched + m, dropped + d
        return {
            "seen": seen,
            "matched": matched,
            "dropped": dropped,
            "decode_errors": self.decode_errors,
        }


def decode_ras(data: bytes, now: float) -> HealthEvent | None:
    if len(data) < RAS_EVENT.size:
        return None
    _, kind, status, severity, count, raw_name = RAS_EVENT.unpack_from(data)
    name = raw_name.split(b"\0", 1)[0].decode("ascii", errors="replace").lower()
    if kind == 1:
        if severity not in AER_SEVERITY:
            return None
        return HealthEvent(
            name,
            "pci",
            AER_CODE[severity],
            AER_SEVERITY[severity],
            f"AER status {status:#x} on {name}",
            now,
            "ebpf",
        )
    if kind == 2:
        return HealthEvent(
            "",
            "host",
            "memory-error",
            Severity.CORRECTABLE,
            f"memory controller: {count} error(s), type {status}",
            now,
            "ebpf",
        )
    return None
