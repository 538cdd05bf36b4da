"""Kill a ledger writer at random instants, 200 times; the state must equal what was acked.

The child announces each operation before it starts and again once the ledger returned. After
a SIGKILL the reopened ledger must hold exactly the acknowledged operations, plus at most the
one operation that was in flight (durable but not yet acknowledged is allowed; acknowledged
but lost, or applied twice, is not). Compaction runs every 37 records, so kills also land in
snapshot writes, and a quarter of the kills land during start-up and replay.
"""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hcsd.ledger import Ledger
from hcsd.ledger.ledger import Capacity
from hcsd.model import Allocation, Grant
from tests.harness.daemon import Daemon

pytestmark = pytest.mark.slow

KILLS = 200
OPS_PER_KILL = 8  # mean acknowledged operations awaited before a kill (after READY)
CHILD = Path(__file__).with_name("churn_child.py")
ROOT = Path(__file__).resolve().parents[2]
Grants = tuple[tuple[str, int, int], ...]


def apply(model: dict[str, Grants], op: dict[str, object]) -> None:
    if op["op"] == "allocate":
        model[str(op["c"])] = tuple((g[0], g[1], g[2]) for g in op["g"])  # type: ignore[attr-defined]
    else:
        model.pop(str(op["c"]), None)


def read_state(state_dir: Path) -> dict[str, Grants]:
    ledger = Ledger(str(state_dir))
    ledger.open()
    ledger.set_capacities({"d0": Capacity(100), "d1": Capacity(100)})
    try:
        ledger.check_invariants()
        return {
            a.container_id: tuple(
                (g.device_uuid, g.vram_bytes, g.compute_percent) for g in a.grants
            )
            for a in ledger.allocations()
        }
    finally:
        ledger.close()


def test_sigkill_at_random_instants_loses_and_doubles_nothing(tmp_path: Path) -> None:
    rng = random.Random(20261122)
    state_dir = tmp_path / "state"
    model: dict[str, Grants] = {}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    acknowledged_total = 0
    in_flight_applied = 0
    for kill in range(KILLS):
        child = subprocess.Popen(
            [sys.executable, str(CHILD), str(state_dir), str(kill)],
            stdout=subprocess.PIPE,
            env=env,
        )
        assert child.stdout is not None
        seen: list[bytes] = []
        if rng.random() < 0.25:
            time.sleep(rng.uniform(0.0, 0.08))  # lands in interpreter start, open or replay
        else:
            line = child.stdout.readline()
            assert line.startswith(b"READY"), line
            # Let it acknowledge a random number of operations first, so the work done per
            # kill does not depend on how loaded the machine is; then a random instant.
            wanted = rng.randint(0, 2 * OPS_PER_KILL)
            while wanted > 0 and (line := child.stdout.readline()):
                seen.append(line)
                wanted -= line == b"A\n"
            time.sleep(rng.uniform(0.0, 0.003))
        child.send_signal(signal.SIGKILL)
        child.wait()
        output = b"".join(seen).decode() + child.stdout.read().decode()
        child.stdout.close()
        pending: dict[str, object] | None = None
        for line in output.splitlines():
            if line.startswith("B "):
                pending = json.loads(line[2:])
            elif line == "A":
                assert pending is not None
                apply(model, pending)
                acknowledged_total += 1
                pending = None
            elif line == "R":
                pending = None
        actual = read_state(state_dir)
        if actual != model:
            assert pending is not None, f"kill {kill}: state differs with nothing in flight"
            with_pending = dict(model)
            apply(with_pending, pending)
            assert actual == with_pending, f"kill {kill}: state is neither acked nor acked+1"
            model = with_pending
            in_flight_applied += 1
    assert acknowledged_total > 1000, "the churn did too little work to prove anything"
    print(
        f"{KILLS} kills, {acknowledged_total} acknowledged operations, "
        f"{in_flight_applied} in-flight operations found durable"
    )


A100 = "GPU-5b2f0c0e-8d1a-4c11-9d2e-a100a100a000"


@pytest.mark.parametrize("length", [0x7FFFFFFF, "bit 20"], ids=["huge", "one-bit"])
def test_hcsd_refuses_to_start_on_a_damaged_middle_length(
    tmp_path: Path, length: int | str
) -> None:
    """Five acknowledged allocations, record 3's length damaged: refuse, keep every byte."""
    ledger = Ledger(str(tmp_path / "state"))
    ledger.open()
    ledger.set_capacities({A100: Capacity(80 * 2**30)})
    for i in range(5):
        ledger.allocate(Allocation(f"job-{i}", (Grant(A100, 2**30),)))
    ledger.close()
    journal = tmp_path / "state" / "journal"
    good = journal.read_bytes()
    offset = 8
    for _ in range(2):
        offset += 8 + struct.unpack_from("<I", good, offset)[0]
    (real,) = struct.unpack_from("<I", good, offset)
    damaged = bytearray(good)
    struct.pack_into("<I", damaged, offset, length if isinstance(length, int) else real ^ 1 << 20)
    journal.write_bytes(bytes(damaged))

    daemon = Daemon(tmp_path)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "hcsd.daemon.lifecycle", "--config", str(daemon.config)],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _, stderr = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
            pytest.fail(f"hcsd started on a damaged journal:\n{stderr}")
        assert process.returncode == 1, stderr
        assert f"failed to open the ledger: {journal}: record at offset {offset} " in stderr
        assert "refusing to guess" in stderr and "torn" not in stderr
        assert journal.read_bytes() == bytes(damaged)  # nothing truncated, nothing reset

        journal.write_bytes(good)  # the operator restores the file: everything is there
        daemon.start()
        held = json.loads(daemon.hcsctl("--json", "allocations").stdout)
        assert sorted(a["container_id"] for a in held) == [f"job-{i}" for i in range(5)]
    finally:
        daemon.close()
