"""The fleet by fabric domain, kept up to date from the nodes that changed: for the placement
rules of `fabric_placement`, at a cost that grows with domains, not nodes.

- `domain_of`: node name -> its fabric domain ("" when it reports none);
- `members`: domain -> frozenset of its node names (rebuilt only for a domain that gained or
  lost a node);
- device buckets: domain -> (vendor, model, free VRAM, idle) -> how many schedulable devices,
  from which `rooms` answers "how many pods like this fit in each domain" per (version, demand)
  without looking at a node.

`sync(snapshot)` brings it to the snapshot's version by visiting only the nodes changed since
(`ClusterState.changed_between`; everything when the change log no longer reaches back). A
snapshot older than what the index has seen is answered from the newer picture: every answer
here is an estimate for choosing a domain, never a plan. Writes happen under the index's own
lock; readers take `domain_of` / `members` without it (a dict read racing a write to another
key is safe, and a members frozenset is replaced, never changed).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping

from hcsd.cluster.demand import Demand
from hcsd.cluster.state import NodeSnapshot, Snapshot

__all__ = ["DomainIndex"]

Bucket = tuple[str, str, int, bool]  # vendor, model (lower case), free VRAM bytes, idle
_ROOMS = 256  # demands whose rooms are kept for the current version


def _buckets(node: NodeSnapshot) -> tuple[Bucket, ...]:
    found = []
    if not node.view.offered:  # DRA mode: none of its devices is the extender's
        return ()
    for device in node.view.devices:
        if not device.health_state.schedulable:
            continue
        used = node.usage.get(device.uuid)
        used_vram = used.vram_bytes if used else 0
        idle = used is None or (used.vram_bytes == 0 and used.compute_percent == 0)
        free = max(device.vram_bytes - used_vram, 0)
        found.append((device.vendor, device.model.lower(), free, idle))
    return tuple(found)


def _room(buckets: Mapping[Bucket, int], demand: Demand) -> int:
    """Pods like `demand` that fit in devices `buckets`: each device's slices of the VRAM asked
    per device (whole idle devices when no VRAM is asked), over the devices one pod takes. The
    slices of one pod are counted as if they could come from several nodes: an upper bound."""
    per_device = max((c.vram_bytes or 0) for c in demand.containers)
    per_pod = sum(c.devices for c in demand.containers) or 1
    slots = 0
    for (vendor, model, free, idle), count in buckets.items():
        if demand.vendors and vendor not in demand.vendors:
            continue
        if demand.models and model not in demand.models:
            continue
        slots += count * (free // per_device if per_device else int(idle))
    return slots // per_pod


class DomainIndex:
    def __init__(self, changed_between: Callable[[int, int], set[str] | None]) -> None:
        self._changed_between = changed_between
        self._lock = threading.Lock()
        self.version = -1  # the snapshot version reflected; -1: none yet
        self.domain_of: dict[str, str] = {}
        self.members: dict[str, frozenset[str]] = {}
        self._buckets: dict[str, Counter[Bucket]] = {}  # domain -> bucket -> devices
        self._node_buckets: dict[str, tuple[Bucket, ...]] = {}
        self._rooms: dict[Demand, dict[str, int]] = {}  # at `version`

    def sync(self, snapshot: Snapshot) -> None:
        """Bring the index to `snapshot` (nothing to do when it has seen it or a newer one)."""
        if snapshot.version <= self.version:
            return
        with self._lock:
            if snapshot.version <= self.version:
                return
            changed = None
            if self.version >= 0:
                changed = self._changed_between(self.version, snapshot.version)
            names = snapshot.nodes.keys() | self.domain_of.keys() if changed is None else changed
            moved: set[str] = set()
            for name in names:
                self._update(name, snapshot.nodes.get(name), moved)
            for domain in moved:
                names_in = frozenset(n for n, d in self.domain_of.items() if d == domain)
                if names_in and domain:
                    self.members[domain] = names_in
                else:
                    self.members.pop(domain, None)
            self.version = snapshot.version
            self._rooms = {}

    def _update(self, name: str, node: NodeSnapshot | None, moved: set[str]) -> None:
        old = self.domain_of.get(name)
        if old:
            self._buckets[old].subtract(self._node_buckets.pop(name, ()))
        domain = node.view.fabric if node is not None else None
        if domain != old:
            moved.update(d for d in (old, domain) if d is not None)
        if node is None or domain is None:
            self.domain_of.pop(name, None)
            return
        self.domain_of[name] = domain
        if domain:
            buckets = self._node_buckets[name] = _buckets(node)
            self._buckets.setdefault(domain, Counter()).update(buckets)

    def rooms(self, snapshot: Snapshot, demand: Demand) -> dict[str, int]:
        """Domain -> about how many more pods like `demand` fit there (never written after)."""
        self.sync(snapshot)
        with self._lock:
            found = self._rooms.get(demand)
            if found is None:
                if len(self._rooms) >= _ROOMS:
                    self._rooms = {}
                found = self._rooms[demand] = {
                    domain: _room(+buckets, demand)
                    for domain, buckets in self._buckets.items()
                    if domain in self.members
                }
            return found
