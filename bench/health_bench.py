"""Health detection latency and CPU under a kernel-log storm, on the real kernel.

Latency: hcsd runs on the simulated node; a client watches the API. For each sample a fatal
line for one of the node's devices (NVIDIA Xid 79, or a fatal PCIe AER line for the others)
is written to /dev/kmsg, and the time until the API's watch stream reports that device
UNHEALTHY is recorded. A short quiet period lets devices recover between samples (rotating
over the six devices). Target: p99 < 100 ms with eBPF; polling (/dev/kmsg) is reported too.

Storm: 10,000 kernel lines per second for 10 s (1% of them candidate lines that parse to an
application Xid, the rest unrelated), and hcsd's CPU use meanwhile.
Both need root (write to /dev/kmsg, load eBPF).

Analyzer: the cost of one correctable event once the trend window holds 10 minutes of them at
1,000 events/s (600,000), in process under a simulated clock; runs without root. Every event is
handled on the event loop, so this is a stall per kernel line during an error storm.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, SimulatedDaemon, summary_us, write_result
from bench.idle import cpu_seconds
from hcsd.api.client import Client
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.health.analyzer import HealthAnalyzer
from hcsd.health.events import HealthEvent, Severity
from hcsd.health.settings import HealthSection
from tests.harness.daemon import Settings

SAMPLES = int(os.environ.get("HCS_HEALTH_SAMPLES", "120"))
STORM_RATE = 10_000
STORM_SECONDS = 10
BPF_DIR = ROOT / "bpf" / "build"
LINES = {
    "0000:17:00.0": "NVRM: Xid (PCI:0000:17:00): 79, pid=1, GPU has fallen off the bus.",
    "0000:31:00.0": "NVRM: Xid (PCI:0000:31:00): 79, pid=1, GPU has fallen off the bus.",
    "0000:c1:00.0": "pcieport 0000:c0:01.0: AER: Uncorrected (Fatal) error received: 0000:c1:00.0",
    "0000:c2:00.0": "pcieport 0000:c0:01.0: AER: Uncorrected (Fatal) error received: 0000:c2:00.0",
    "0000:81:00.0": "pcieport 0000:80:01.0: AER: Uncorrected (Fatal) error received: 0000:81:00.0",
    "0000:b1:00.0": "pcieport 0000:b0:01.0: AER: Uncorrected (Fatal) error received: 0000:b1:00.0",
}


def health(source: str) -> Settings:
    return {
        "health": {"source": source, "bpf_dir": BPF_DIR, "quiet_period": 0.3, "tick_interval": 0.05}
    }


def kmsg(line: str) -> None:
    with open("/dev/kmsg", "w") as f:
        f.write(f"<3>{line}\n")


def measure_latency(source: str) -> dict[str, object]:
    daemon = SimulatedDaemon(health(source))
    events: queue.Queue[tuple[float, pb.Event]] = queue.Queue()
    client = Client(daemon.socket)

    def watch() -> None:
        try:
            for event in client.watch(send_initial=False):
                events.put((time.perf_counter(), event))
        except Exception:  # the stream ends when hcsd stops
            return

    threading.Thread(target=watch, daemon=True).start()
    by_bus = {d.pci_bus_id: d.uuid for d in client.devices()}
    node = client.node()
    latencies: list[float] = []
    try:
        time.sleep(0.3)
        buses = list(LINES)
        for sample in range(SAMPLES):
            bus = buses[sample % len(buses)]
            if sample and sample % len(buses) == 0:
                time.sleep(0.45)  # every device back to healthy before its next turn
            written = time.perf_counter()
            kmsg(f"{LINES[bus]} sample={sample}")
            deadline = written + 2
            while True:
                arrived, event = events.get(timeout=max(0.01, deadline - time.perf_counter()))
                if (
                    event.kind == pb.Event.KIND_DEVICE_CHANGED
                    and event.device.uuid == by_bus[bus]
                    and event.device.health_state == pb.HEALTH_STATE_UNHEALTHY
                ):
                    latencies.append(arrived - written)
                    break
    finally:
        client.close()
        daemon.stop()
    return {"source": node.health_source, **summary_us(latencies)}


def measure_storm(source: str) -> dict[str, object]:
    daemon = SimulatedDaemon(health(source))
    with Client(daemon.socket) as client:
        active = client.node().health_source
    writer = (
        "import time\n"
        f"rate, seconds = {STORM_RATE}, {STORM_SECONDS}\n"
        "f = open('/dev/kmsg', 'w', buffering=1)\n"
        "start = time.perf_counter(); n = 0\n"
        "while time.perf_counter() - start < seconds:\n"
        "    for _ in range(100):\n"
        "        if n % 100 == 0:\n"
        "            f.write(f'<6>NVRM: Xid (PCI:0000:17:00): 13, storm {n}\\n')\n"
        "        else:\n"
        "            f.write(f'<6>storm line {n} from an unrelated driver\\n')\n"
        "        n += 1\n"
        "    ahead = n / rate - (time.perf_counter() - start)\n"
        "    if ahead > 0: time.sleep(ahead)\n"
        "print(n / (time.perf_counter() - start))\n"
    )
    try:
        time.sleep(0.5)
        cpu0, t0 = cpu_seconds(daemon.process.pid), time.monotonic()
        out = subprocess.run(
            [sys.executable, "-c", writer],
            capture_output=True,
            text=True,
            check=True,
            timeout=STORM_SECONDS * 3,
        )
        time.sleep(0.5)  # let the backlog drain
        cpu1, t1 = cpu_seconds(daemon.process.pid), time.monotonic()
    finally:
        daemon.stop()
    return {
        "source": active,
        "lines_per_s_written": round(float(out.stdout.strip())),
        "cpu_percent_of_one_core": round(100 * (cpu1 - cpu0) / (t1 - t0), 2),
    }


def measure_analyzer(
    rate: int = 1_000, minutes: float = 10.0, samples: int = 2_000
) -> dict[str, object]:
    """Per-event cost of a correctable error with a full trend window (see the docstring)."""
    now = [0.0]
    analyzer = HealthAnalyzer(HealthSection().analyzer_settings(), lambda: now[0], ["gpu"])
    correctable = HealthEvent("0000:17:00.0", "nvidia", "xid-92", Severity.CORRECTABLE, "", 0.0)
    step = 1.0 / rate
    filled = int(rate * minutes * 60)
    fill_start = time.perf_counter()
    for _ in range(filled):
        now[0] += step
        analyzer.observe("gpu", correctable)
    fill_seconds = time.perf_counter() - fill_start
    costs = []
    for _ in range(samples):
        now[0] += step
        started = time.perf_counter()
        analyzer.observe("gpu", correctable)
        costs.append(time.perf_counter() - started)
    return {
        "events_in_window": filled,
        "fill_us_per_event": round(fill_seconds / filled * 1e6, 2),
        **summary_us(costs),
    }


def main() -> dict[str, object]:
    analyzer = measure_analyzer()
    print(
        f"analyzer: one correctable event with {analyzer['events_in_window']:,} in the window: "
        f"p50 {analyzer['p50_us']} us, p99 {analyzer['p99_us']} us, max {analyzer['max_us']} us"
    )
    if os.geteuid() != 0:
        print("health bench: kernel parts skipped: need root (write /dev/kmsg, load eBPF)")
        path = write_result("health", {"analyzer": analyzer, "skipped": "kernel parts need root"})
        print(f"-> {path}")
        return {"analyzer": analyzer, "skipped": "kernel parts need root"}
    subprocess.run(["make", "-s", "-C", str(ROOT / "bpf")], check=True)
    control = Path("/proc/sys/kernel/printk_devkmsg")
    before = control.read_text().strip()
    control.write_text("on\n")
    try:
        result: dict[str, object] = {
            "analyzer": analyzer,
            "latency_ebpf": measure_latency("ebpf"),
            "latency_kmsg_polling": measure_latency("kmsg"),
            "storm_ebpf": measure_storm("ebpf"),
            "storm_kmsg_polling": measure_storm("kmsg"),
            "target_ebpf_p99_us": 100_000,
        }
    finally:
        control.write_text(before + "\n")
    ebpf = result["latency_ebpf"]
    assert isinstance(ebpf, dict)
    result["meets_target"] = ebpf["source"] == "ebpf" and ebpf["p99_us"] < 100_000
    path = write_result("health", result)
    for key in ("latency_ebpf", "latency_kmsg_polling"):
        r = result[key]
        assert isinstance(r, dict)
        print(
            f"health detection ({r['source']}, {r['n']} samples): kmsg write -> API watch "
            f"UNHEALTHY p50 {r['p50_us'] / 1000:.2f} ms, p99 {r['p99_us'] / 1000:.2f} ms"
        )
    for key in ("storm_ebpf", "storm_kmsg_polling"):
        r = result[key]
        assert isinstance(r, dict)
        print(
            f"storm ({r['source']}): {r['lines_per_s_written']} lines/s written, hcsd CPU "
            f"{r['cpu_percent_of_one_core']}% of one core"
        )
    print(f"-> {path}")
    return result


if __name__ == "__main__":
    main()
