"""Node heartbeats: the syncers' Leases `hcs-node-<node>` as the extender sees them.

hcs-syncer renews its node's Lease only while hcsd answers, so a node is usable while its
Lease is younger than its duration. A renewal is timed by when this process saw it (the
monotonic clock), not by the stamp another machine wrote, so clock skew between nodes cannot
make a live node look dead; only the first sight of a Lease (the list at start) has nothing
else to go by and trusts the stamp, measured against this machine's clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hcsd.cluster.timefmt import parse_time
from hcsd.contract.names import NODE_LEASE_PREFIX

__all__ = ["Heartbeat", "Heartbeats", "NodeLease", "node_lease", "stale_reason"]

DEFAULT_DURATION = 40.0  # a Lease without leaseDurationSeconds: the syncer's default


@dataclass(frozen=True, slots=True)
class NodeLease:
    """What the leases informer keeps of one heartbeat Lease."""

    node: str
    stamp: str  # spec.renewTime as written by the syncer
    duration: float


def node_lease(obj: Mapping[str, Any]) -> NodeLease | None:
    """A syncer's heartbeat Lease; None for every other Lease (the leader's, for one)."""
    name = str((obj.get("metadata") or {}).get("name", ""))
    if not name.startswith(NODE_LEASE_PREFIX):
        return None
    spec = obj.get("spec") or {}
    return NodeLease(
        name[len(NODE_LEASE_PREFIX) :],
        str(spec.get("renewTime", "")),
        float(spec.get("leaseDurationSeconds") or DEFAULT_DURATION),
    )


@dataclass(frozen=True, slots=True)
class Heartbeat:
    renewed: float  # local monotonic time the renewal was seen
    duration: float
    stamp: str

    @property
    def expires(self) -> float:
        return self.renewed + self.duration


def stale_reason(beat: Heartbeat | None, now: float) -> str | None:
    """Why the node's heartbeat does not vouch for it at monotonic `now`, or None."""
    if beat is None:
        return "no hcs heartbeat Lease (is hcs-syncer running on the node?)"
    age = now - beat.renewed
    if age > beat.duration:
        return (
            f"hcs heartbeat is {age:.0f}s old (limit {beat.duration:.0f}s): "
            "hcsd or hcs-syncer is down"
        )
    return None


class Heartbeats:
    """The latest heartbeat per node.

    Not locked on its own: `ClusterState` calls it under its lock. A deleted Lease leaves its
    last heartbeat in place, to age out like a syncer that stopped renewing, as long as the
    node's ComputeNode is there; once both are gone, `ClusterState` drops it.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock  # wall clock, to read a first-seen stamp
        self.beats: dict[str, Heartbeat] = {}

    def record(self, lease: NodeLease, now: float) -> bool:
        """Note `lease` as seen at monotonic `now`; True when the node comes back to life
        (answers decided while it was stale, or unknown, said "stale" and must go)."""
        before = self.beats.get(lease.node)
        if before is not None and before.stamp == lease.stamp:
            return False  # the same renewal again (a relist): nothing new
        renewed_wall = parse_time(lease.stamp)
        if before is None and renewed_wall is not None:
            renewed = now - max(0.0, self.clock() - renewed_wall)
        else:
            renewed = now  # a renewal seen now: no clock skew between nodes involved
        self.beats[lease.node] = Heartbeat(renewed, lease.duration, lease.stamp)
        return before is None or now - before.renewed > before.duration
