"""The requeue worker's cost at 5,000 nodes: its step, and filter's p99 with it running.

In-process, on the unit fleet (tests/unit/fleet.py): 5,000 nodes with both A100s taken,
`PODS` refused pods of `DISTINCT` sizes that fit nowhere (the worst case: every pair is
decided and none is touched). Cases:

- `step-changed`: 50 nodes change (usage only grows and falls back) and every pod is refused
  again, as kube-scheduler re-filters on any pod event: the step that follows;
- `step-missed`: every pod's back-off hid a change from it (MISSED);
- `filter`: filter's wall-clock p50/p99 for a pod that fits, every node offered, alone and
  with the worker stepping every 100 ms on a 50-node churn from another thread.

Printed and written as JSON (bench/out/requeue.json). Figures from a loaded machine are noisy.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import summary_us, write_result
from tests.unit.fleet import add_node, beat, pod
from tests.unit.test_requeue import FULL, setup

NODES, PODS, DISTINCT, CHANGED = 5_000, 1_000, 200, 50


def _fleet() -> tuple[Any, Any, list[str], list[tuple[dict[str, Any], Any]]]:
    e, requeue, _, _ = setup()
    names = [f"n{i}" for i in range(NODES)]
    for n in names:
        add_node(e, n, allocated=FULL)
        beat(e, n)
    e.state.snapshot()
    pods = []
    for i in range(PODS):
        p = pod({"ai.compute/vram": f"{81 * 1024 + (i % DISTINCT) * 10}Mi"}, uid=f"p{i}")
        pods.append((p, e.decider.demand(p)))
    return e, requeue, names, pods


def _churn(e: Any, names: list[str], version: int) -> int:
    for j in range(CHANGED):
        grown = {0: ("a", 80), 1: ("b", 70 + version % 10)}
        add_node(e, names[(version * CHANGED + j) % NODES], allocated=grown, version=version)
        version += 1
    return version


def _steps(e: Any, requeue: Any, names: list[str], pods: list[Any]) -> dict[str, Any]:
    for p, d in pods:
        requeue.filtered(p, d, names, False)
    requeue.step()
    changed, missed, version = [], [], 2
    for _ in range(5):
        version = _churn(e, names, version)
        for p, d in pods:
            requeue.filtered(p, d, names, False)
        started = time.perf_counter()
        requeue.step()
        changed.append(time.perf_counter() - started)
    for _ in range(5):
        for r in requeue._pods.values():
            r.look = 2  # MISSED
        version = _churn(e, names, version)
        started = time.perf_counter()
        requeue.step()
        missed.append(time.perf_counter() - started)
    return {"step-changed": summary_us(changed), "step-missed": summary_us(missed)}


def _filter_p99(e: Any, names: list[str], worker: bool) -> dict[str, Any]:
    stop = threading.Event()

    def churn() -> None:
        version = 10_000
        while not stop.wait(0.1):
            version = _churn(e, names, version)
            e.requeue.step()

    thread = threading.Thread(target=churn, daemon=True)
    if worker:
        thread.start()
    fits = pod({"ai.compute/vram": "1Gi"}, uid="fits")
    took = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        started = time.perf_counter()
        e.filter(fits, names)
        took.append(time.perf_counter() - started)
    stop.set()
    if worker:
        thread.join()
    return summary_us(took)


def main() -> dict[str, Any]:
    e, requeue, names, pods = _fleet()
    result: dict[str, Any] = {"nodes": NODES, "pods": PODS, "distinct": DISTINCT}
    result.update(_steps(e, requeue, names, pods))
    # The fitting filter pod frees nothing; the small pod fits the 10 GiB left nowhere, so
    # give it room on a tenth of the fleet.
    for n in names[::10]:
        add_node(e, n, allocated={0: ("a", 80)}, version=99_999)
    result["filter-alone"] = _filter_p99(e, names, worker=False)
    result["filter-with-worker"] = _filter_p99(e, names, worker=True)
    write_result("requeue", result)
    for case, value in result.items():
        print(f"{case}: {value}")
    return result


if __name__ == "__main__":
    main()
