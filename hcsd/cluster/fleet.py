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

A row is WIDTH slots wide whatever the widest node, so one odd node cannot widen (and slow the
copy of) every row; a node the arrays cannot hold (more devices, a VRAM figure the key cannot
carry) gets `whole` False and is decided node by node, never an error under the lock. The
heartbeats live in arrays of their own: a Lease renewal re-copies those (16 bytes a node), not
the device slots (20 bytes each).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from itertools import count
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from hcsd.allocator import Usage
from hcsd.cluster.heartbeats import Heartbeat
from hcsd.cluster.objects import NodeView

__all__ = ["MAX_FREE", "SHIFT", "WIDTH", "FleetIndex", "FleetRows"]

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

SHIFT = 4  # bits of a key below the free VRAM: the slot's column (< WIDTH)
WIDTH = 16  # device slots in a row; a node with more is decided node by node
MAX_FREE = (1 << (63 - SHIFT)) - 1  # the most VRAM a key can carry
_SMALL = np.iinfo(np.int16).max  # health scores and group ids are int16
_SLOTS = {"key": np.int64, "vram": np.int64, "health": np.int16, "group": np.int16}
_ROWS = {"ready": np.bool_, "whole": np.bool_, "keyset": np.int32, "signature": np.int64}
_BEATS = {"renewed": np.float64, "duration": np.float64}
_MIN_SIGNATURES = 1024  # reason signatures remembered: at least this, at most 4 a node


@dataclass(frozen=True, slots=True)
class FleetIndex:
    """The fleet at one snapshot; never written after it is made."""

    rows: Mapping[str, int]  # node name -> row
    generation: int  # changes whenever `rows` does (a node added or removed)
    key: Ints  # [row, slot]: free VRAM << SHIFT | slot; -1: no device, or not schedulable
    health: npt.NDArray[np.int16]  # the device's health score
    vram: Ints  # the device's VRAM
    group: npt.NDArray[np.int16]  # id into `groups` (-1 where key is -1)
    renewed: Floats  # [row]: the heartbeat's renewal (monotonic); NaN: no heartbeat
    duration: Floats  # [row]: the heartbeat's duration
    ready: Bools  # [row]: a ComputeNode the extender may use (NodeView.offered)
    whole: Bools  # [row]: the slots hold the node; False: decide it node by node
    keyset: npt.NDArray[np.int32]  # [row]: id into `keysets`
    signature: Ints  # [row]: the reason signature's id
    groups: tuple[tuple[str, str], ...]  # (vendor, model): the chip-model groups
    keysets: tuple[frozenset[str] | None, ...]  # status.assignmentKeys as reported


K = TypeVar("K", bound=Hashable)


class _Ids(Generic[K]):
    """Small ids for values rows refer to, counted, so an id no row uses is given back."""

    def __init__(self, vacant: K) -> None:
        self._ids: dict[K, int] = {}
        self._values: list[K] = []
        self._uses: list[int] = []
        self._free: list[int] = []
        self._vacant = vacant  # what a given-back id reads as until it is reused

    def take(self, value: K) -> int:
        found = self._ids.get(value)
        if found is None:
            found = self._free.pop() if self._free else len(self._values)
            if found == len(self._values):
                self._values.append(value)
                self._uses.append(0)
            self._values[found] = value
            self._ids[value] = found
        self._uses[found] += 1
        return found

    def give(self, found: int) -> None:
        self._uses[found] -= 1
        if not self._uses[found]:
            del self._ids[self._values[found]]
            self._values[found] = self._vacant
            self._free.append(found)

    def __len__(self) -> int:
        return len(self._ids)

    def values(self) -> tuple[K, ...]:
        return tuple(self._values)


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


def _arrays(columns: Mapping[str, Any], shape: tuple[int, ...]) -> dict[str, Any]:
    return {name: np.zeros(shape, dtype) for name, dtype in columns.items()}


class FleetRows:
    """The live arrays; every method is called under `ClusterState`'s lock."""

    def __init__(self) -> None:
        self._rows: dict[str, int] = {}
        self._spare: list[int] = []  # rows of removed nodes, reused for the next new one
        self._generation = 0
        self._capacity = 0
        self._slot: dict[str, Any] = {}
        self._row: dict[str, Any] = {}
        self._beat: dict[str, Any] = {}
        self._groups: _Ids[tuple[str, str]] = _Ids(("", ""))
        self._keysets: _Ids[frozenset[str] | None] = _Ids(None)
        self._held: dict[int, tuple[int, list[int]]] = {}  # row -> (keyset id, group ids)
        self._signatures: dict[tuple[object, ...], int] = {}
        self._next_signature = count()  # never reused: a forgotten id matches nothing new
        self._rows_copy: tuple[int, dict[str, int]] = (-1, {})  # (generation, rows)
        self._beats: dict[str, Heartbeat] = {}
        self._copies: tuple[dict[str, Any], dict[str, Any]] | None = None  # slots, rows
        self._beat_copies: dict[str, Any] | None = None
        self._frozen: FleetIndex | None = None
        self._resize(64)

    def _resize(self, capacity: int) -> None:
        old = self._capacity
        slot, row, beat = (
            _arrays(_SLOTS, (capacity, WIDTH)), _arrays(_ROWS, (capacity,)),
            _arrays(_BEATS, (capacity,)),
        )  # fmt: skip
        slot["group"][:] = slot["key"][:] = -1
        beat["renewed"][:] = math.nan
        for new, current in ((slot, self._slot), (row, self._row), (beat, self._beat)):
            for name, array in current.items():
                new[name][:old] = array
        self._slot, self._row, self._beat = slot, row, beat
        self._capacity = capacity

    def put(self, name: str, view: NodeView, usage: Mapping[str, Usage]) -> None:
        """The node's row from its view and usage (its NodeSnapshot's inputs)."""
        row = self._rows.get(name)
        if row is None:
            row = self._spare.pop() if self._spare else len(self._rows)
            self._rows[name] = row
            self._generation += 1
        if row >= self._capacity:
            self._resize(2 * (row + 1))
        self._release(row)
        self._frozen = self._copies = self._beat_copies = None
        keyset = self._keysets.take(view.key_ids)
        groups = self._fill(row, view, usage)
        self._held[row] = (keyset, groups)
        self._row["ready"][row] = view.offered  # Ready or Degraded, and not in DRA mode
        self._row["keyset"][row] = keyset
        signature = _signature(view, usage)
        found = self._signatures.get(signature)
        if found is None:
            if len(self._signatures) >= max(4 * len(self._rows), _MIN_SIGNATURES):
                self._signatures.clear()
            found = self._signatures[signature] = next(self._next_signature)
        self._row["signature"][row] = found
        self._set_beat(row, self._beats.get(name))

    def _fill(self, row: int, view: NodeView, usage: Mapping[str, Usage]) -> list[int]:
        """The row's slots; the group ids it took. A node the slots cannot hold is left
        empty with `whole` False (decided node by node)."""
        slot = self._slot
        slot["group"][row] = slot["key"][row] = -1
        slot["health"][row] = slot["vram"][row] = 0
        self._row["whole"][row] = False
        if len(view.devices) > WIDTH:
            return []
        ordered = sorted(
            enumerate(view.devices),
            key=lambda p: (-p[1].health_score, p[1].index, p[1].vendor.value, p[1].model, p[0]),
        )
        encoded = []
        for column, (_, d) in enumerate(ordered):
            free = d.vram_bytes - usage.get(d.uuid, Usage()).vram_bytes
            if not (0 <= d.vram_bytes <= MAX_FREE and abs(d.health_score) <= _SMALL):
                return []
            key = free << SHIFT | column if d.health_state.schedulable and free >= 0 else -1
            encoded.append((column, d, key))
        taken = []
        for column, d, key in encoded:
            slot["health"][row, column] = d.health_score
            slot["vram"][row, column] = d.vram_bytes
            if key >= 0:
                slot["key"][row, column] = key
                taken.append(self._groups.take((d.vendor.value, d.model)))
                slot["group"][row, column] = taken[-1]
        if taken and max(taken) >= _SMALL:  # more chip models than int16 ids: node by node
            slot["group"][row] = slot["key"][row] = -1
        else:
            self._row["whole"][row] = True
        return taken

    def _release(self, row: int) -> None:
        """Give back the ids the row's last contents took."""
        held = self._held.pop(row, None)
        if held is not None:
            self._keysets.give(held[0])
            for group in held[1]:
                self._groups.give(group)

    def drop(self, name: str) -> None:
        row = self._rows.pop(name, None)
        if row is not None:
            self._spare.append(row)
            self._generation += 1
            self._frozen = self._copies = self._beat_copies = None
            self._release(row)
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
            self._frozen = self._beat_copies = None
            self._set_beat(row, beat)

    def _set_beat(self, row: int, beat: Heartbeat | None) -> None:
        self._beat["renewed"][row] = math.nan if beat is None else beat.renewed
        self._beat["duration"][row] = 0.0 if beat is None else beat.duration

    def tables(self) -> tuple[int, int, int]:
        """(chip-model groups, keysets, reason signatures) remembered: for tests and gauges."""
        return len(self._groups), len(self._keysets), len(self._signatures)

    def freeze(self) -> FleetIndex:
        """A copy for decisions (the same one until the next change). Only what changed is
        copied again: a heartbeat, its two arrays; a node, the rest."""
        if self._frozen is None:
            if self._rows_copy[0] != self._generation:
                self._rows_copy = (self._generation, dict(self._rows))
            # Every row handed out so far, and at least one: a name without a row reads row 0
            # (masked out as unknown), so an empty fleet needs a row too.
            used = max(1, len(self._rows) + len(self._spare))
            if self._copies is None:
                self._copies = (
                    {name: array[:used].copy() for name, array in self._slot.items()},
                    {name: array[:used].copy() for name, array in self._row.items()},
                )
            if self._beat_copies is None:
                self._beat_copies = {name: a[:used].copy() for name, a in self._beat.items()}
            slot, row = self._copies
            beat = self._beat_copies
            self._frozen = FleetIndex(
                rows=self._rows_copy[1], generation=self._generation,
                key=slot["key"], health=slot["health"], vram=slot["vram"], group=slot["group"],
                renewed=beat["renewed"], duration=beat["duration"], ready=row["ready"],
                whole=row["whole"], keyset=row["keyset"], signature=row["signature"],
                groups=self._groups.values(), keysets=self._keysets.values(),
            )  # fmt: skip
        return self._frozen
