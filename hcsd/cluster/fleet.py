"""The fleet as arrays: one row per node, one column per device slot, for vectorised decisions.

A filter over 5,000 nodes for a demand nobody asked before cannot afford a Python decision
per node (~10 us each). `FleetRows` keeps, per node, what the one-slice decision reads (free
VRAM, health, index, VRAM and chip-model group of each schedulable device; heartbeat; phase;
assignment keys) in numpy arrays, and is kept current from the same events that rebuild a
`NodeSnapshot` (under `ClusterState`'s lock). `freeze()` hands decisions a `FleetIndex`, a copy
no event writes to again, so a decision over it needs no lock.

Slots of a row are ordered as the allocator breaks ties between devices with the same free
VRAM (healthier, then lower index, then the earlier chip-model group), and each slot's *key*
is its free VRAM shifted left past the slot's column: so the smallest key at or above the
demand's (shifted) VRAM is the allocator's choice, found in one pass (`hcsd.cluster.bulk`).
Each node also
gets a *reason signature*: equal signatures mean equal failure reasons for any demand the bulk
path decides (the devices' vendor, model, index and health, and per chip-model group the most
free VRAM and the device holding it), so a failure reason is worded once per signature.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import count
from typing import Any

import numpy as np
import numpy.typing as npt

from hcsd.allocator import Usage
from hcsd.cluster.heartbeats import Heartbeat
from hcsd.cluster.objects import NodeView

__all__ = ["SHIFT", "FleetIndex", "FleetRows"]

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

SHIFT = 16  # bits of a key below the free VRAM: the slot (devices on one node < 65,536)
_SLOT_COLUMNS = ("key", "health", "vram", "group")
_SIGNATURES = 100_000  # distinct reason signatures remembered before their ids are forgotten


@dataclass(frozen=True, slots=True)
class FleetIndex:
    """The fleet at one snapshot; never written after it is made."""

    rows: Mapping[str, int]  # node name -> row
    generation: int  # changes whenever `rows` does (a node added or removed)
    key: Ints  # [row, slot]: free VRAM << SHIFT | slot; -1: no device, or not schedulable
    health: Ints  # the device's health score
    vram: Ints  # the device's VRAM
    group: Ints  # id into `groups` (-1 where key is -1)
    renewed: Floats  # [row]: the heartbeat's renewal (monotonic); NaN: no heartbeat
    duration: Floats  # [row]: the heartbeat's duration
    ready: Bools  # [row]: a ComputeNode whose phase is not NotReady
    keyset: Ints  # [row]: id into `keysets`
    signature: Ints  # [row]: the reason signature's id
    groups: tuple[tuple[str, str], ...]  # (vendor, model): the chip-model groups
    keysets: tuple[frozenset[str] | None, ...]  # status.assignmentKeys as reported


def _signature(view: NodeView, usage: Mapping[str, Usage]) -> tuple[object, ...]:
    devices = tuple((d.vendor.value, d.model, d.index, d.health_state.value) for d in view.devices)
    tops: dict[tuple[str, str], tuple[int, int]] = {}
    for d in view.devices:  # the first device with the most free VRAM, in the node's order
        if d.health_state.schedulable:
            free = d.vram_bytes - usage.get(d.uuid, Usage()).vram_bytes
            key = (d.vendor.value, d.model)
            if key not in tops or free > tops[key][0]:
                tops[key] = (free, d.index)
    return devices, tuple(sorted(tops.items()))


class FleetRows:
    """The live arrays; every method is called under `ClusterState`'s lock."""

    def __init__(self) -> None:
        self._rows: dict[str, int] = {}
        self._spare: list[int] = []  # rows of removed nodes, reused for the next new one
        self._generation = 0
        self._capacity = 0
        self._slots = 0
        self._slot: dict[str, Ints] = {}
        self._row: dict[str, Any] = {}
        self._groups: dict[tuple[str, str], int] = {}
        self._keysets: dict[frozenset[str] | None, int] = {}
        self._signatures: dict[tuple[object, ...], int] = {}
        self._next_signature = count()  # never reused: a forgotten id matches nothing new
        self._rows_copy: tuple[int, dict[str, int]] = (-1, {})  # (generation, rows)
        self._beats: dict[str, Heartbeat] = {}
        self._frozen: FleetIndex | None = None
        self._resize(64, 8)

    def _resize(self, capacity: int, slots: int) -> None:
        old_capacity, old_slots = self._capacity, self._slots
        slot = {name: np.zeros((capacity, slots), np.int64) for name in _SLOT_COLUMNS}
        slot["group"][:] = slot["key"][:] = -1
        row: dict[str, Any] = {
            "renewed": np.full(capacity, math.nan),
            "duration": np.zeros(capacity),
            "ready": np.zeros(capacity, np.bool_),
            "keyset": np.zeros(capacity, np.int64),
            "signature": np.zeros(capacity, np.int64),
        }
        for name, array in self._slot.items():
            slot[name][:old_capacity, :old_slots] = array
        for name, array in self._row.items():
            row[name][:old_capacity] = array
        self._slot, self._row = slot, row
        self._capacity, self._slots = capacity, slots

    def _id(self, table: dict[Any, int], key: Any) -> int:
        found = table.get(key)
        if found is None:
            found = table[key] = len(table)
        return found

    def put(self, name: str, view: NodeView, usage: Mapping[str, Usage]) -> None:
        """The node's row from its view and usage (its NodeSnapshot's inputs)."""
        row = self._rows.get(name)
        if row is None:
            row = self._spare.pop() if self._spare else len(self._rows)
            self._rows[name] = row
            self._generation += 1
        width = max(self._slots, len(view.devices))
        if row >= self._capacity or width > self._slots:
            self._resize(max(self._capacity, 2 * (row + 1)), width)
        self._frozen = None
        slot = self._slot
        slot["group"][row] = slot["key"][row] = -1
        slot["health"][row] = slot["vram"][row] = 0
        ordered = sorted(
            enumerate(view.devices),
            key=lambda p: (-p[1].health_score, p[1].index, p[1].vendor.value, p[1].model, p[0]),
        )
        for column, (_, d) in enumerate(ordered):
            slot["health"][row, column] = d.health_score
            slot["vram"][row, column] = d.vram_bytes
            free = d.vram_bytes - usage.get(d.uuid, Usage()).vram_bytes
            if d.health_state.schedulable and free >= 0:
                slot["key"][row, column] = free << SHIFT | column
                slot["group"][row, column] = self._id(self._groups, (d.vendor.value, d.model))
        self._row["ready"][row] = view.phase != "NotReady"
        self._row["keyset"][row] = self._id(self._keysets, view.key_ids)
        signature = _signature(view, usage)
        found = self._signatures.get(signature)
        if found is None:
            if len(self._signatures) > _SIGNATURES:
                self._signatures.clear()
            found = self._signatures[signature] = next(self._next_signature)
        self._row["signature"][row] = found
        self._set_beat(row, self._beats.get(name))

    def drop(self, name: str) -> None:
        row = self._rows.pop(name, None)
        if row is not None:
            self._spare.append(row)
            self._generation += 1
            self._frozen = None
            self._slot["group"][row] = self._slot["key"][row] = -1
            self._row["ready"][row] = False

    def beat(self, name: str, beat: Heartbeat | None) -> None:
        """The node's heartbeat now (None: forgotten); a node may beat before it has a row."""
        if beat is None:
            self._beats.pop(name, None)
        else:
            self._beats[name] = beat
        row = self._rows.get(name)
        if row is not None:
            self._frozen = None
            self._set_beat(row, beat)

    def _set_beat(self, row: int, beat: Heartbeat | None) -> None:
        self._row["renewed"][row] = math.nan if beat is None else beat.renewed
        self._row["duration"][row] = 0.0 if beat is None else beat.duration

    def freeze(self) -> FleetIndex:
        """A copy for decisions (the same one until the next change)."""
        if self._frozen is None:
            if self._rows_copy[0] != self._generation:
                self._rows_copy = (self._generation, dict(self._rows))
            # Every row handed out so far, and at least one: a name without a row reads row 0
            # (masked out as unknown), so an empty fleet needs a row too.
            used = max(1, len(self._rows) + len(self._spare))
            slot = {name: array[:used].copy() for name, array in self._slot.items()}
            row = {name: array[:used].copy() for name, array in self._row.items()}
            self._frozen = FleetIndex(
                rows=self._rows_copy[1], generation=self._generation,
                key=slot["key"], health=slot["health"], vram=slot["vram"], group=slot["group"],
                renewed=row["renewed"], duration=row["duration"], ready=row["ready"],
                keyset=row["keyset"], signature=row["signature"],
                groups=tuple(self._groups), keysets=tuple(self._keysets),
            )  # fmt: skip
        return self._frozen
