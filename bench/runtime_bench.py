"""Container create+start time through a real containerd 2.3 (crictl, runc), with hcsd's NRI plugin
injecting a GPU slice vs the same containerd with no plugin, in one run. Needs root and the
runtime test peers (built and cached by tests/harness/peers/)."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import summary_us, write_result
from tests.harness.peers.runtimes import ensure_binaries
from tests.runtime.containerd import Containerd
from tests.runtime.node import runtime_hcsd, start_registered

CONTAINERS = 25


def create_times(runtime: Containerd, tag: str, annotations: dict[str, str]) -> list[float]:
    seconds = []
    for i in range(CONTAINERS):
        pod = runtime.run_pod(f"{tag}{i}", "bench", f"uid-{tag}-{i}")
        started = time.perf_counter()
        ctr = runtime.create_container(
            pod, "main", command=["sleep", "30"], annotations=annotations
        )
        runtime.start(ctr)
        seconds.append(time.perf_counter() - started)
        runtime.stop_container(ctr)
        runtime.remove_container(ctr)
    return seconds


def main() -> dict[str, object]:
    if os.geteuid() != 0:
        print("runtime bench skipped: needs root")
        return {"skipped": "needs root"}
    binaries = ensure_binaries()
    if isinstance(binaries, str):
        print(f"runtime bench skipped: {binaries}")
        return {"skipped": binaries}
    directory = Path(tempfile.mkdtemp(prefix="hcs-rtb-", dir="/tmp"))
    runtime = Containerd(binaries, directory / "c")
    runtime.launch()
    daemon = None
    try:
        without = create_times(runtime, "plain", {})
        # The runtime tests' node, without an assignment key: the containers ask by annotation.
        daemon = runtime_hcsd(directory / "d", runtime.nri_socket, key=None)
        start_registered(daemon)
        with_hcsd = create_times(runtime, "gpu", {"hcs.io/vram": "1Gi"})
    finally:
        if daemon is not None:
            daemon.close()
        runtime.close()
    ratio = statistics.median(with_hcsd) / statistics.median(without)
    result = {
        "containers": CONTAINERS,
        "create_start_without_hcsd": summary_us(without),
        "create_start_with_hcsd": summary_us(with_hcsd),
        "median_ratio": round(ratio, 3),
    }
    path = write_result("runtime", result)
    a, b = result["create_start_without_hcsd"], result["create_start_with_hcsd"]
    assert isinstance(a, dict) and isinstance(b, dict)
    print(
        f"containerd create+start ({CONTAINERS} each): without hcsd p50 {a['p50_us'] / 1000:.1f} "
        f"ms, with hcsd injecting a GPU slice p50 {b['p50_us'] / 1000:.1f} ms, ratio "
        f"{ratio:.3f} -> {path}"
    )
    return result


if __name__ == "__main__":
    main()
