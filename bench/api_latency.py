"""Allocate + release through the local API over its unix socket: per-call latency.

A real hcsd process on the simulated node; a blocking gRPC client (what hcsctl and the hooks
use) sends allocate then release for a fresh container each time, so every allocate is a
fsync'd ledger write. Target: p99 of the pair < 2 ms.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import SimulatedDaemon, summary_us, write_result
from hcsd.api.client import Client
from hcsd.api.v1 import hcsd_pb2 as pb

WARMUP = 200
PAIRS = 3000


def main() -> dict[str, object]:
    daemon = SimulatedDaemon()
    allocate_s: list[float] = []
    release_s: list[float] = []
    pair_s: list[float] = []
    try:
        with Client(daemon.socket) as client:
            for i in range(WARMUP + PAIRS):
                request = pb.AllocateRequest(container_id=f"bench-{i}", vram="4Gi")
                t0 = time.perf_counter()
                client.allocate(request)
                t1 = time.perf_counter()
                client.release(f"bench-{i}")
                t2 = time.perf_counter()
                if i >= WARMUP:
                    allocate_s.append(t1 - t0)
                    release_s.append(t2 - t1)
                    pair_s.append(t2 - t0)
    finally:
        daemon.stop()
    result = {
        "pairs": PAIRS,
        "allocate": summary_us(allocate_s),
        "release": summary_us(release_s),
        "allocate_plus_release": summary_us(pair_s),
        "target_pair_p99_us": 2000,
    }
    result["meets_target"] = result["allocate_plus_release"]["p99_us"] < 2000  # type: ignore[index]
    path = write_result("api_latency", result)
    pair = result["allocate_plus_release"]
    print(
        f"api allocate+release over the socket ({PAIRS} pairs): "
        f"p50 {pair['p50_us']} us, p99 {pair['p99_us']} us "  # type: ignore[index]
        f"(allocate p50 {result['allocate']['p50_us']} us, "  # type: ignore[index]
        f"release p50 {result['release']['p50_us']} us) -> {path}"
    )  # type: ignore[index]
    return result


if __name__ == "__main__":
    main()
