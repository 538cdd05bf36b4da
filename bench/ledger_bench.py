"""Ledger throughput with fsync per acknowledged operation, and replay time of 100k records.

Throughput: allocate/release through Ledger on the real file system (each op fdatasync'd
before it returns). Replay: a journal of 100,000 records (built with fsync turned off, which
changes nothing in the bytes) is opened five times; the median open() time is reported.
Target: replay < 2 s.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_result
from hcsd.ledger import FileSystem, Ledger
from hcsd.ledger.ledger import Capacity, LedgerSection
from hcsd.model import Allocation, Grant, PodRef

CAPACITY = {f"dev-{i}": Capacity(1 << 50) for i in range(8)}
THROUGHPUT_OPS = 5000
REPLAY_RECORDS = 100_000


class NoSyncFs(FileSystem):
    def sync(self, fd: int) -> None:
        pass


def allocation(i: int) -> Allocation:
    return Allocation(
        container_id=f"{i:064x}",
        grants=(Grant(f"dev-{i % 8}", 4 << 30, 0),),
        pod=PodRef("team-a", f"trainer-{i}", f"uid-{i:032x}"),
        container_name="main",
        created=1_700_000_000.0 + i,
    )


def churn(ledger: Ledger, ops: int) -> None:
    for i in range(ops // 2):
        ledger.allocate(allocation(i))
        ledger.release(f"{i:064x}")


def main() -> dict[str, object]:
    base = Path(tempfile.mkdtemp(prefix="hcs-ledger-bench-", dir=str(Path.cwd())))
    try:
        ledger = Ledger(str(base / "tput"), LedgerSection(compact_after=10_000))
        ledger.open()
        ledger.set_capacities(CAPACITY)
        t0 = time.perf_counter()
        churn(ledger, THROUGHPUT_OPS)
        elapsed = time.perf_counter() - t0
        ledger.close()
        ops_per_s = THROUGHPUT_OPS / elapsed

        build = Ledger(str(base / "replay"), LedgerSection(compact_after=10**9), fs=NoSyncFs())
        build.open()
        build.set_capacities(CAPACITY)
        # Half allocations, half releases, and 1,000 allocations left held at the end.
        churn(build, REPLAY_RECORDS - 1000)
        for i in range(10**6, 10**6 + 1000):
            build.allocate(allocation(i))
        build.close()
        journal_bytes = (base / "replay" / "journal").stat().st_size
        times = []
        for _ in range(5):
            reader = Ledger(str(base / "replay"), LedgerSection(compact_after=10**9))
            t0 = time.perf_counter()
            report = reader.open()
            times.append(time.perf_counter() - t0)
            reader.close()
            assert report.records == REPLAY_RECORDS and report.allocations == 1000
        replay_s = statistics.median(times)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result = {
        "acked_ops_per_s_with_fsync": round(ops_per_s),
        "throughput_ops": THROUGHPUT_OPS,
        "replay_records": REPLAY_RECORDS,
        "replay_journal_bytes": journal_bytes,
        "replay_median_s": round(replay_s, 3),
        "replay_runs_s": [round(t, 3) for t in times],
        "target_replay_s": 2.0,
        "meets_target": replay_s < 2.0,
    }
    path = write_result("ledger", result)
    print(
        f"ledger: {result['acked_ops_per_s_with_fsync']} acknowledged ops/s with fsync; "
        f"replay of {REPLAY_RECORDS} records ({journal_bytes / 2**20:.1f} MiB) "
        f"median {replay_s:.3f} s -> {path}"
    )
    return result


if __name__ == "__main__":
    main()
