"""Health events through bcc, for kernels without BTF but with kernel headers.

Common on 4.19-based distributions, where CO-RE objects cannot be relocated. bcc compiles the
same filter at start-up against the running kernel's headers. It comes from the distribution
(`python3-bpfcc`), never from PyPI (the PyPI package named `bcc` is unrelated); the venv finds it
through the system site-packages directory.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from hcsd.contract.kmsg_needles import message_start, render_matcher
from hcsd.health.parsing import DEFAULT_RULES, LineRule, parse_kernel_line
from hcsd.health.sources.base import Emit, HealthSource, SourceUnavailable

__all__ = ["BccSource", "bcc_program"]

log = logging.getLogger(__name__)
SYSTEM_SITE = "/usr/lib/python3/dist-packages"


def bcc_program() -> str:
    """The console filter in bcc's dialect, with the matcher bpf/kmsg.bpf.c uses."""
    return f"""
#define HCS_MSG_MAX 256
struct event {{ u64 ts_ns; u32 len; u16 needle; u16 truncated; char msg[HCS_MSG_MAX]; }};
struct positions {{ u32 offset[2]; }};
BPF_RINGBUF_OUTPUT(events, 64);
BPF_PERCPU_ARRAY(scratch, struct event, 1);
BPF_PERCPU_ARRAY(offsets, struct positions, 1);
{render_matcher()}
TRACEPOINT_PROBE(printk, console) {{
    int zero = 0;
    struct event *e = scratch.lookup(&zero);
    struct positions *p = offsets.lookup(&zero);
    if (!e || !p) return 0;
    u32 location = args->data_loc_msg;
    u32 len = location >> 16;
    e->truncated = len > HCS_MSG_MAX - 1;
    if (len > HCS_MSG_MAX - 1) len = HCS_MSG_MAX - 1;
    bpf_probe_read_kernel(e->msg, len & (HCS_MSG_MAX - 1), (void *)args + (location & 0xffff));
    e->len = len;
    u32 found = hcs_kmsg_needle(e->msg, len, p->offset);
    if (!found) return 0;
    e->needle = found;
    e->ts_ns = bpf_ktime_get_ns();
    events.ringbuf_output(e, sizeof(*e), 0);
    return 0;
}}
"""


def _import_bcc() -> Any:
    try:
        import bcc  # type: ignore[import-not-found]
    except ImportError:
        if SYSTEM_SITE not in sys.path:
            sys.path.append(SYSTEM_SITE)
        try:
            import bcc
        except ImportError as e:
            raise SourceUnavailable(
                "bcc is not installed (Debian/Ubuntu: apt install python3-bpfcc)"
            ) from e
    if not hasattr(bcc, "BPF"):
        raise SourceUnavailable("the 'bcc' module found is not the BPF compiler collection")
    return bcc


class BccSource(HealthSource):
    name = "bcc"

    def __init__(self, rules: Sequence[LineRule] = DEFAULT_RULES) -> None:
        self.rules = rules
        self._bpf: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.matched = 0

    def start(self, loop: asyncio.AbstractEventLoop, emit: Emit) -> None:
        headers = f"/lib/modules/{os.uname().release}/build"
        if not os.path.isdir(headers) and not os.path.exists("/sys/kernel/kheaders.tar.xz"):
            # bcc compiles against the running kernel's headers; without them, importing it
            # would only map LLVM into the daemon (tens of MB) for a certain failure.
            raise SourceUnavailable(f"bcc needs kernel headers and there are none at {headers}")
        bcc = _import_bcc()
        try:
            self._bpf = bcc.BPF(text=bcc_program().encode())
        except Exception as e:  # bcc raises bare Exception on compile failure
            headers = f"/lib/modules/{os.uname().release}/build"
            why = "" if os.path.isdir(headers) else f" (no kernel headers at {headers})"
            raise SourceUnavailable(f"bcc cannot compile the filter here: {e}{why}") from e

        def on_event(_ctx: Any, data: Any, size: int) -> None:
            import ctypes

            raw = ctypes.string_at(data, size)
            length = int.from_bytes(raw[8:12], "little")
            text = raw[16 : 16 + min(length, 256)].split(b"\0", 1)[0]
            text = text[message_start(text) :]
            event = parse_kernel_line(text, time.monotonic(), source="bcc", rules=self.rules)
            if event is not None:
                self.matched += 1
                loop.call_soon_threadsafe(emit, event)

        self._bpf["events"].open_ring_buffer(on_event)
        # bcc offers no pollable fd for its ring buffer: one thread polls with a timeout.
        self._thread = threading.Thread(target=self._poll, name="hcs-bcc", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._bpf.ring_buffer_poll(200)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None

    def stats(self) -> dict[str, int]:
        return {"matched": self.matched}
