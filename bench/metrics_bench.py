"""The cost of /metrics: prometheus_client against the hand-rendered text it replaced.

A 16-device node (the simulated backend: 8 A100s, 4 Ascend 910B3, 4 MLU370, every device
holding two allocations). For each renderer:

- render time: one scrape's body, rendered in process, median (and p90) over many renders;
- RSS delta: in a fresh interpreter, resident memory after importing the renderer and
  rendering once, less before (the service built already), median over several processes;
- the body's size.

"new" is everything hcsd's /metrics now says (with the API and NRI latency histograms and the
process collector); "new-node-families" is the node's families alone, the same ground the old
renderer covered, so the library's own cost per line shows.

The old renderer is the last hand-rendered `hcsd/daemon/metrics.py` (commit 8b2f4dc), read
from git and loaded under another module name, so both run against the same live service.
Also: a real hcsd on that node scraped over HTTP (the bounded server), median wall time, in
the text format and in OpenMetrics.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
import types
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, summary_us, write_result
from hcsd.discovery import discover_all
from hcsd.discovery.backends.simulated import SimulatedBackend
from hcsd.ledger import Ledger
from hcsd.model import Request, Vendor
from hcsd.service import NodeService
from tests.harness.daemon import Daemon

OLD_COMMIT = "8b2f4dc"
RENDERS = 300
PROCESSES = 7
MODELS = (
    [("nvidia", "A100-SXM4-80GB", "80Gi", 312)] * 8
    + [("ascend", "Ascend910B3", "64Gi", 313)] * 4
    + [("cambricon", "MLU370-X8", "48Gi", 96)] * 4
)
OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def node_file(path: Path) -> Path:
    lines = []
    for index, (vendor, model, vram, tflops) in enumerate(MODELS):
        lines += [
            "[[device]]",
            f'uuid = "DEV-{index:04d}-0000-0000-000000000000"',
            f'vendor = "{vendor}"',
            f'model = "{model}"',
            f"index = {index}",
            f'pci_bus_id = "0000:{0x17 + index:02x}:00.0"',
            f'vram = "{vram}"',
            f"tflops_fp16 = {tflops}",
            f'nodes = ["/dev/bench{index}:240:{index}"]',
            "",
        ]
    path.write_text("\n".join(lines))
    return path


def service(directory: Path) -> NodeService:
    inventory = discover_all("bench", [SimulatedBackend(node_file(directory / "node.toml"))])
    ledger = Ledger(str(directory / "state"))
    ledger.open()
    node = NodeService(inventory, ledger)
    for vendor in (Vendor.NVIDIA, Vendor.ASCEND, Vendor.CAMBRICON):
        for n in range(sum(1 for m in MODELS if m[0] == vendor.value) * 2):
            node.allocate(
                Request(f"{vendor.value}-{n}", vram_bytes=2**30, vendors=frozenset({vendor}))
            )
    return node


def old_renderer() -> types.ModuleType:
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:hcsd/daemon/metrics.py"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    module = types.ModuleType("hcsd_old_metrics")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{OLD_COMMIT}:hcsd/daemon/metrics.py", "exec"), module.__dict__)
    return module


def renders(which: str, node: NodeService) -> tuple[list[float], int]:
    if which == "old":
        render = old_renderer().render_metrics
        body = lambda: render(node).encode()  # noqa: E731
    elif which == "new-node-families":  # the node's families alone: what the old one wrote
        from prometheus_client import CollectorRegistry

        from hcsd.daemon.metrics import exposition
        from hcsd.daemon.node_metrics import NodeCollector

        alone = CollectorRegistry()
        alone.register(NodeCollector(node))
        body = lambda: exposition(alone)[0]  # noqa: E731
    else:
        from hcsd.daemon.metrics import exposition, registry
        from hcsd.telemetry import Telemetry

        found = registry(node, telemetry=Telemetry())
        body = lambda: exposition(found)[0]  # noqa: E731
    size = len(body())
    times = []
    for _ in range(RENDERS):
        started = time.perf_counter()
        body()
        times.append(time.perf_counter() - started)
    return times, size


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def rss_child(which: str) -> None:
    """In a fresh interpreter: build the service, then RSS before and after the renderer."""
    # What hcsd imports anyway, whichever renderer it has: only the renderer's own cost counts.
    import hcsd.daemon.serving
    import hcsd.health.watching
    import hcsd.sections
    import hcsd.watchdog.metric_families  # noqa: F401

    with tempfile.TemporaryDirectory() as directory:
        node = service(Path(directory))
        before = rss_kib()
        if which == "old":
            old_renderer().render_metrics(node)
        else:
            from hcsd.daemon.metrics import exposition, registry
            from hcsd.telemetry import Telemetry

            exposition(registry(node, telemetry=Telemetry()))
        print(json.dumps({"rss_delta_kib": rss_kib() - before}))


def rss_deltas(which: str) -> list[int]:
    found = []
    for _ in range(PROCESSES):
        out = subprocess.run(
            [sys.executable, __file__, "--rss", which], check=True, capture_output=True, text=True
        ).stdout
        found.append(json.loads(out.strip().splitlines()[-1])["rss_delta_kib"])
    return found


def http_scrapes(directory: Path) -> dict[str, object]:
    daemon = Daemon(directory / "daemon", node_file=node_file(directory / "daemon-node.toml"))
    try:
        daemon.start()
        found: dict[str, object] = {}
        for name, accept in (("text", "text/plain"), ("openmetrics", OPENMETRICS)):
            times = []
            size = 0
            for _ in range(100):
                request = urllib.request.Request(
                    f"http://127.0.0.1:{daemon.port}/metrics", headers={"Accept": accept}
                )
                started = time.perf_counter()
                with urllib.request.urlopen(request, timeout=10) as answer:
                    size = len(answer.read())
                times.append(time.perf_counter() - started)
            found[name] = {**summary_us(times), "bytes": size}
        return found
    finally:
        daemon.close()


def main() -> None:
    if sys.argv[1:2] == ["--rss"]:
        rss_child(sys.argv[2])
        return
    result: dict[str, object] = {"devices": len(MODELS), "renders": RENDERS}
    with tempfile.TemporaryDirectory() as directory:
        node = service(Path(directory))
        for which in ("old", "new", "new-node-families"):
            times, size = renders(which, node)
            result[which] = {"render": summary_us(times), "bytes": size}
            if which != "new-node-families":
                deltas = rss_deltas(which)
                result[which]["rss_delta_kib"] = {
                    "median": statistics.median(deltas),
                    "all": deltas,
                }
        result["http_scrape_new"] = http_scrapes(Path(directory))
    print(json.dumps(result, indent=2))
    print(write_result("metrics", result))


if __name__ == "__main__":
    main()
