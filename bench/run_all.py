"""Run every benchmark of hcsd and print one summary (JSON per benchmark in bench/out/)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import (
    api_latency,
    cluster_bench,
    discovery_bench,
    dra_bench,
    extender_bench,
    extender_scaling,
    fabric_bench,
    health_bench,
    idle,
    job_bench,
    ledger_bench,
    nri_bench,
    requeue_bench,
    runtime_bench,
    watchdog_bench,
)
from bench.common import write_result
from bench.libhcs import run as libhcs_bench


def main() -> int:
    results = {
        "api_latency": api_latency.main(),
        "ledger": ledger_bench.main(),
        "discovery": discovery_bench.main(),
        "idle": idle.main(),
        "health": health_bench.main(),
        "nri": nri_bench.main(),
        "runtime": runtime_bench.main(),
        "libhcs": libhcs_bench.main(),
        "watchdog": watchdog_bench.main(),
        "extender": extender_bench.main(),
        "extender_scaling": extender_scaling.main(),
        "fabric": fabric_bench.main(),
        "requeue": requeue_bench.main(),
        "cluster": cluster_bench.main(),
        "jobs": job_bench.main(),
        "dra": dra_bench.main(),
    }
    write_result("summary", results)
    missed = [name for name, result in results.items() if not result.get("meets_target", True)]
    if missed:
        print(f"targets missed: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
