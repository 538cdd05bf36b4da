"""Helpers shared by the benchmarks: start hcsd on the simulated node, write results."""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.harness.daemon import Daemon, Settings

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def summary_us(seconds: list[float]) -> dict[str, float]:
    micro = [s * 1e6 for s in seconds]
    return {
        "n": len(micro),
        "p50_us": round(statistics.median(micro), 1),
        "p90_us": round(percentile(micro, 0.90), 1),
        "p99_us": round(percentile(micro, 0.99), 1),
        "max_us": round(max(micro), 1),
    }


def write_result(name: str, data: dict[str, Any]) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    data = {
        "benchmark": name,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **data,
    }
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


class SimulatedDaemon(Daemon):
    """hcsd started on the simulated mixed node in a temporary directory (the tests' harness),
    with NRI off unless `settings` turn it on; `stop` also removes the directory."""

    def __init__(self, settings: Settings | None = None, *, watchdog_usec: int = 0) -> None:
        directory = Path(tempfile.mkdtemp(prefix="hcs-bench-"))
        super().__init__(directory, settings={"runtime": {"nri": False}})
        self.configure(settings or {})
        self.start(watchdog_usec)

    def stop(self) -> int:
        code = super().stop()
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return code
