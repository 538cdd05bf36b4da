"""Idle hcsd: resident memory and CPU use, sampled from /proc.

hcsd runs on the simulated node with metrics on and a systemd-style watchdog (WATCHDOG_USEC
of 20 s, so a ping every 10 s, as the shipped unit would have); after it settles, CPU time is
measured over the window. Targets: RSS < 60 MB, CPU < 1% of one core.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import SimulatedDaemon, write_result

SETTLE_S = 3.0
WINDOW_S = float(os.environ.get("HCS_IDLE_WINDOW", "30"))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def main() -> dict[str, object]:
    # Everything on, as installed: health watching (eBPF where it loads) and the NRI plugin
    # (retrying its connection: no runtime listens here), plus a systemd-style watchdog.
    bpf = Path(__file__).resolve().parent.parent / "bpf" / "build"
    daemon = SimulatedDaemon(
        {"health": {"source": "auto", "bpf_dir": bpf}, "runtime": {"nri": True}},
        watchdog_usec=20_000_000,
    )
    pid = daemon.process.pid
    try:
        time.sleep(SETTLE_S)
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(WINDOW_S)
        cpu1, t1 = cpu_seconds(pid), time.monotonic()
        rss = rss_bytes(pid)
        threads = len(os.listdir(f"/proc/{pid}/task"))
    finally:
        daemon.stop()
    cpu_percent = 100 * (cpu1 - cpu0) / (t1 - t0)
    result = {
        "window_s": WINDOW_S,
        "rss_mb": round(rss / 1e6, 1),
        "cpu_percent_of_one_core": round(cpu_percent, 3),
        "threads": threads,
        "targets": {"rss_mb": 60, "cpu_percent": 1.0},
        "meets_target": rss / 1e6 < 60 and cpu_percent < 1.0,
    }
    path = write_result("idle", result)
    print(
        f"idle hcsd over {WINDOW_S:.0f} s: RSS {result['rss_mb']} MB, "
        f"CPU {cpu_percent:.3f}% of one core, {threads} threads -> {path}"
    )
    return result


if __name__ == "__main__":
    main()
