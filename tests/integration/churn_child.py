"""Child of the crash test: allocate/release churn against a ledger until SIGKILLed.

Protocol on stdout (each line one os.write, so lines never interleave or tear):
  READY seq              after the ledger opened
  B <op json>            before an operation starts
  A                      after the operation was acknowledged (returned)
  R                      the operation was refused (over capacity): nothing changed
"""

from __future__ import annotations

import json
import os
import random
import sys

from hcsd.ledger import Ledger, OverCapacity
from hcsd.ledger.ledger import Capacity, LedgerSection
from hcsd.model import Allocation, Grant

DEVICES = {"d0": Capacity(100), "d1": Capacity(100)}


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main() -> None:
    state_dir, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    ledger = Ledger(state_dir, LedgerSection(compact_after=37))
    ledger.open()
    ledger.set_capacities(DEVICES)
    say(f"READY {ledger.seq}")
    while True:
        held = [a.container_id for a in ledger.allocations()]
        if held and rng.random() < 0.45:
            cid = rng.choice(held)
            say("B " + json.dumps({"op": "release", "c": cid}))
            ledger.release(cid)
            say("A")
            continue
        cid = f"c{rng.randrange(10_000)}"
        if cid in held:
            continue
        devices = rng.sample(sorted(DEVICES), rng.choice([1, 1, 2]))
        grants = [[d, rng.randint(1, 30), rng.choice([0, 10])] for d in devices]
        say("B " + json.dumps({"op": "allocate", "c": cid, "g": grants}))
        allocation = Allocation(
            container_id=cid, grants=tuple(Grant(*g) for g in grants), created=1.0
        )
        try:
            ledger.allocate(allocation)
        except OverCapacity:
            say("R")
            continue
        say("A")


if __name__ == "__main__":
    main()
