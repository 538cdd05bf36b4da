"""How the extender's filter+prioritize cost grows with the fleet: nodes (100, 1,000, 5,000,
20,000 simulated) x devices per node (8, 16), for repeated demand (pods of one job: 16 GiB
each) and a new size every pod.

Each point is `extender_bench.measure` against a fresh extender process: the mixed fleet with
every node's device count set to 8 or 16 (linked in a ring), a ComputeNode update every 10 ms,
filter then prioritize over HTTP with every node's name. Prints a table and writes
`bench/out/extender_scaling.json` with one row per point (nodes, devices_per_node, demand,
p50_ms, p99_ms, extender_cpu_ms_per_pod, nodes_passing_median): ready to plot.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_result
from bench.extender_bench import measure

NODES = (100, 1000, 5000, 20000)
DEVICES_PER_NODE = (8, 16)
SAMPLES = 100
DEMANDS = {
    "repeated": ({"ai.compute/vram": "16Gi"}, {}),
    "new-size-each-pod": ({"ai.compute/vram": "NEW"}, {}),
}


def main() -> dict[str, Any]:
    rng = random.Random(7)
    points = []
    for devices in DEVICES_PER_NODE:
        for nodes in NODES:
            measured = measure(nodes, rng, DEMANDS, samples=SAMPLES, devices=devices)
            for demand in DEMANDS:
                points.append({"nodes": nodes, "devices_per_node": devices, "demand": demand,
                               **measured[demand]})  # fmt: skip
    print(f"{'nodes':>6} {'devices':>7} {'demand':<18} {'p50 ms':>7} {'p99 ms':>7} {'CPU ms':>7}")
    for p in points:
        print(
            f"{p['nodes']:>6} {p['devices_per_node']:>7} {p['demand']:<18} "
            f"{p['p50_ms']:>7} {p['p99_ms']:>7} {p['extender_cpu_ms_per_pod']:>7}"
        )
    out = {"samples_per_point": SAMPLES, "points": points}
    write_result("extender_scaling", out)
    return out


if __name__ == "__main__":
    main()
