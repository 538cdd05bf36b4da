"""The cost of /metrics: prometheus_client against the hand-rendered text it replaced.

A 16-device node (the simulated backend: 8 A100s, 4 Ascend 910B3, 4 MLU370, every device
holding two allocations). For each renderer:

- render time: one scrape's body, rendered in process, median (and p90) over many renders;
- RSS delta: in a fresh interpreter (bench/metrics_node.py, which imports nothing that
  loads prometheus_client before its baseline), resident memory after importing the renderer
  and rendering once, less before (the service built already), median over several
  processes; for prometheus_client also the import alone;
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
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import summary_us, write_result
from bench.metrics_node import MODELS, node_file, old_renderer, service
from hcsd.service import NodeService
from tests.harness.daemon import Daemon

RENDERS = 300
PROCESSES = 7
OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
CHILD = Path(__file__).with_name("metrics_node.py")


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


def rss_deltas(which: str) -> list[dict[str, int]]:
    return [
        json.loads(
            subprocess.run(
                [sys.executable, str(CHILD), which], check=True, capture_output=True, text=True
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        for _ in range(PROCESSES)
    ]


def http_scrapes(directory: Path) -> dict[str, object]:
    """A loop of GETs (served from the one-second cache but for one a second), and scrapes
    1.1 s apart (each rendered), as Prometheus sees them."""
    daemon = Daemon(directory / "daemon", node_file=node_file(directory / "daemon-node.toml"))
    try:
        daemon.start()
        found: dict[str, object] = {}
        for name, accept in (("text", "text/plain"), ("openmetrics", OPENMETRICS)):
            for kind, count, pause in (("loop", 100, 0.0), ("rendered", 12, 1.1)):
                times = []
                size = 0
                for _ in range(count):
                    time.sleep(pause)
                    request = urllib.request.Request(
                        f"http://127.0.0.1:{daemon.port}/metrics", headers={"Accept": accept}
                    )
                    started = time.perf_counter()
                    with urllib.request.urlopen(request, timeout=10) as answer:
                        size = len(answer.read())
                    times.append(time.perf_counter() - started)
                found[f"{name}_{kind}"] = {**summary_us(times), "bytes": size}
        return found
    finally:
        daemon.close()


def main() -> None:
    result: dict[str, object] = {"devices": len(MODELS), "renders": RENDERS}
    with tempfile.TemporaryDirectory() as directory:
        node = service(Path(directory))
        for which in ("old", "new", "new-node-families"):
            times, size = renders(which, node)
            result[which] = {"render": summary_us(times), "bytes": size}
            if which != "new-node-families":
                found = rss_deltas(which)
                for key in found[0]:
                    values = [f[key] for f in found]
                    result[which][key] = {"median": statistics.median(values), "all": values}
        result["http_scrape_new"] = http_scrapes(Path(directory))
    print(json.dumps(result, indent=2))
    print(write_result("metrics", result))


if __name__ == "__main__":
    main()
