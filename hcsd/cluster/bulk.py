"""The common demand (one container, one slice of one device's VRAM) decided for a whole node
list at once, over a `FleetIndex`, with numpy.

The rule is the allocator's (`hcsd.allocator.choose`, through `planner.plan`), written over
arrays: among the schedulable devices the demand's allow-lists admit and that have the VRAM
free, the one leaving the least VRAM behind, then the healthiest, then the lowest index, then
the first chip-model group in (vendor, model) order; its score is `planner._score`'s for one
grant. A node that cannot take the pod gets the allocator's own sentence: worded once per
reason signature (see `fleet.py`) by `planner.plan` on one node that has it, and shared by
every node with that signature. `tests/unit/test_bulk_decisions.py` holds the two to the same
answers on random fleets.

Costs a few array passes over (nodes x device slots) and no Python per node; a filter over
5,000 nodes of 8 devices takes about a millisecond however new the demand.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hcsd.cluster.demand import Demand
from hcsd.cluster.fleet import MAX_FREE, SHIFT, Bools, FleetIndex, Ints

__all__ = ["Bulk", "BulkVerdict", "one_slice"]

_BIG = np.iinfo(np.int64).max
_ROW_LISTS = 16  # node lists whose rows are remembered (kube-scheduler sends one or a few)


def one_slice(demand: Demand) -> int | None:
    """The VRAM asked when the demand is of the kind decided here, else None."""
    if len(demand.containers) != 1 or demand.substitution:
        return None
    container = demand.containers[0]
    if container.devices != 1 or container.tflops_fp16 is not None:
        return None
    if container.vram_bytes is not None and container.vram_bytes > MAX_FREE:
        return None  # more than a key can carry (and than any device has)
    return container.vram_bytes


@dataclass(frozen=True, slots=True)
class BulkVerdict:
    failed: dict[str, str]  # in the order of the names asked
    scores: dict[str, int]
    valid_until: float  # the first heartbeat among passing nodes to expire
    undecided: list[str]  # nodes whose reason the reference did not confirm: decide one by one


class Bulk:
    def __init__(self) -> None:
        # (fleet generation, the names) -> their rows: the rows change only when nodes come or go
        self._rows: OrderedDict[tuple[int, tuple[str, ...]], Ints] = OrderedDict()

    def rows(self, fleet: FleetIndex, names: Sequence[str]) -> Ints:
        """Each name's row, -1 for a node without one."""
        key = (fleet.generation, tuple(names))
        found = self._rows.get(key)
        if found is None:
            get = fleet.rows.get
            found = np.fromiter((get(n, -1) for n in names), np.int64, len(names))
            self._rows[key] = found
            while len(self._rows) > _ROW_LISTS:
                try:
                    self._rows.popitem(last=False)
                except KeyError:  # another thread emptied it meanwhile
                    break
        return found

    def judge(
        self,
        fleet: FleetIndex,
        demand: Demand,
        want: int,
        names: Sequence[str],
        now: float,
        *,
        unusable: Callable[[str], str],
        reason: Callable[[str], str | None],
        key_refusal: Callable[[str], str | None] | None,
        quota_refusal: str | None,
    ) -> BulkVerdict:
        """Every node of `names` decided at once. `unusable(name)`: why a node without a
        ComputeNode, a live heartbeat or a Ready phase takes nothing; `reason(name)`: the
        reference's reason the demand does not fit on the node (None if it fits after all);
        `key_refusal(name)`: why a fitting node lacks the signing key (None: no key asked);
        `quota_refusal`: why the namespace's quota refuses the pod's floor anywhere."""
        rows = self.rows(fleet, names)
        known = rows >= 0
        r = np.where(known, rows, 0)
        renewed = fleet.renewed[r]
        usable = known & fleet.ready[r] & ~np.isnan(renewed)
        usable &= ~(now - renewed > fleet.duration[r])
        named = np.array(names, dtype=object)
        reasons = np.empty(len(rows), dtype=object)
        for i in np.flatnonzero(~usable).tolist():
            reasons[i] = unusable(names[i])
        refused = ~usable
        apart = usable & ~fleet.whole[r]  # nodes the slots do not hold: node by node
        usable &= ~apart
        fits, score = _fit(fleet, r, demand, want, usable)
        unfit = usable & ~fits
        undecided = np.union1d(
            np.flatnonzero(apart), _word(fleet.signature[r], unfit, reasons, names, reason)
        )
        passing = fits.copy()
        if key_refusal is not None and fits.any():
            keyset = fleet.keyset[r]
            reported = [i for i, keys in enumerate(fleet.keysets) if keys is not None]
            for k in np.unique(keyset[fits & np.isin(keyset, reported)]).tolist():
                same = fits & (keyset == k)
                text = key_refusal(names[int(np.argmax(same))])  # one sentence per keyset
                if text is not None:
                    reasons[same] = text
                    passing &= ~same
        if quota_refusal is not None:
            reasons[passing] = quota_refusal
            passing[:] = False
        refused |= unfit | (fits & ~passing)
        failed = dict(zip(named[refused].tolist(), reasons[refused].tolist(), strict=True))
        scores = dict(zip(named[passing].tolist(), score[passing].tolist(), strict=True))
        expiry = (renewed + fleet.duration[r])[passing]
        valid_until = float(expiry.min()) if expiry.size else math.inf
        return BulkVerdict(failed, scores, valid_until, named[undecided].tolist())


def _fit(
    fleet: FleetIndex, r: Ints, demand: Demand, want: int, usable: Bools
) -> tuple[Bools, Ints]:
    """Per row of `r`: whether the pod fits, and its score where it does. The smallest key at
    or above the demand's is the allocator's device (see `fleet.py`)."""
    vendors = {v.value for v in demand.vendors}
    models = demand.models
    cover = demand.cover
    admitted = [
        (not vendors or vendor in vendors)
        and (not models or model.lower() in models)
        and (cover is None or cover.admits(vendor, model))
        for vendor, model in fleet.groups
    ]
    whole = 2 * len(r) >= len(fleet.key)  # most of the fleet: no gather of the 2-D arrays
    key = fleet.key if whole else fleet.key[r]
    fit = key >= (want << SHIFT)
    if not all(admitted):
        group = fleet.group if whole else fleet.group[r]
        fit &= np.array([*admitted, False])[group]  # group -1: key is -1, never fits anyway
    best = np.where(fit, key, _BIG).min(axis=1) if key.shape[1] else np.full(len(key), _BIG)
    if whole:
        best = best[r]
    fits = (best != _BIG) & usable
    flat = r * fleet.key.shape[1] + (best & ((1 << SHIFT) - 1))
    flat[~fits] = 0
    vram = fleet.vram.ravel()[flat] if fleet.key.size else np.zeros(len(r), np.int64)
    health = fleet.health.ravel()[flat] if fleet.key.size else np.zeros(len(r), np.int64)
    # `planner._score` for one grant, operation for operation (the same floats).
    left = np.maximum((best >> SHIFT) - want, 0).astype(np.float64)
    leftover = np.divide(left, vram, out=np.zeros(len(r)), where=vram != 0)
    value = 0.6 * (1.0 - leftover) + 0.4 * (health / 100.0)
    score = np.clip(np.rint(value * 10), 0, 10).astype(np.int64)
    return fits, score


def _word(
    signatures: Ints,
    unfit: Bools,
    reasons: npt.NDArray[np.object_],
    names: Sequence[str],
    reason: Callable[[str], str | None],
) -> Ints:
    """Fill the reasons of the rows that do not fit, one reference call per signature; the
    rows the reference did not confirm are taken out of `unfit` and returned."""
    if not unfit.any():
        return np.zeros(0, np.int64)
    which = np.flatnonzero(unfit)
    _, first, inverse = np.unique(signatures[which], return_index=True, return_inverse=True)
    worded = [reason(names[i]) for i in which[first].tolist()]
    reasons[which] = np.array(worded, dtype=object)[inverse.reshape(-1)]
    unconfirmed: Ints = which[reasons[which] == None]  # noqa: E711 (elementwise)
    unfit[unconfirmed] = False
    return unconfirmed
