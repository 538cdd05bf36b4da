"""The requeue worker's records and rules that need none of its state: what it remembers of
a refused pod, whether a node's change can have made room, the annotation's value."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

from hcsd.cluster.decisions import unusable
from hcsd.cluster.demand import Demand
from hcsd.cluster.state import Snapshot

__all__ = ["ALL", "FRESH", "MISSED", "SEEN", "Ask", "Refused", "made_room", "outcome", "stamp"]

SEEN, FRESH, MISSED, ALL = 0, 1, 2, 3  # Refused.look (a larger one covers a smaller)
# admission-requeue.yaml's message for a pod bound meanwhile: gone, not denied.
_BOUND_MESSAGE = "may touch only pods that are not bound yet"


class Ask(NamedTuple):
    """A waiting pod's fields as the step copied them under the lock."""

    rank: int  # -priority
    refused_at: float
    pod: Refused
    look: int
    demand: Demand
    candidates: frozenset[str] | None
    quota_bound: bool
    generation: int
    looked: int


@dataclass(slots=True)
class Refused:
    uid: str
    namespace: str
    name: str
    demand: Demand
    # The nodes kube-scheduler offered; None: any node, for it may have stopped looking at
    # 100 feasible nodes (percentageOfNodesToScore) and offered only those.
    candidates: frozenset[str] | None
    priority: int
    refused_at: float  # monotonic
    quota_bound: bool  # the namespace's quota refused it wherever it went
    touches: int = 0
    queued: bool = False  # touched since its last refusal: kube-scheduler has it queued
    next_touch: float = 0.0
    # Which nodes to look at for it in the next step: FRESH (refused since the last step):
    # every node changed since; SEEN: those that freed room since; MISSED (its back-off hid
    # changes from it): all its nodes.
    look: int = 0
    # Refusals so far: a touch whose patch was in flight while filter refused the pod again
    # must not mark it queued (that refusal came after kube-scheduler saw the touch).
    generation: int = 0
    looked: int = -1  # the step that last asked about it (MISSED: what freed since)


def made_room(
    last: Snapshot | None,
    last_seen: float,
    snapshot: Snapshot,
    seen: float,
    *,
    name: str,
    signing: str,
) -> bool:
    """Whether the node's change since the last step can have made room for anyone: a
    device's usage fell, its devices or phase changed, it became usable again (its
    heartbeat), or it got the signing key. A node whose usage only grew (a bind, an
    allocation) is not looked at."""
    new = snapshot.nodes.get(name)
    old = last.nodes.get(name) if last is not None else None
    if new is None or old is None or last is None:
        return new is not None
    got_key = bool(signing) and (
        old.view.key_ids is not None
        and signing not in old.view.key_ids
        and (new.view.key_ids is None or signing in new.view.key_ids)
    )
    revived = unusable(last, name, last_seen) is not None and (
        unusable(snapshot, name, seen) is None
    )
    return (
        got_key
        or revived
        or new.view.devices != old.view.devices
        or new.view.phase != old.view.phase
        or any(
            (now := new.usage.get(uuid)) is None
            or now.vram_bytes < was.vram_bytes
            or now.compute_percent < was.compute_percent
            for uuid, was in old.usage.items()
        )
    )


def outcome(status: int, text: str) -> str:
    """What a refused touch means. gone: deleted (404), replaced (409, or 422 on the uid
    precondition), bound meanwhile (the policy's 403 for bound pods); denied: any other 403
    or 422, which nobody expects (the policy or the role changed); failed: no answer."""
    if status in (404, 409) or (
        (status == 422 and "metadata.uid" in text) or (status == 403 and _BOUND_MESSAGE in text)
    ):
        return "gone"
    return "denied" if status in (403, 422) else "failed"


def stamp() -> str:
    """Now, to the millisecond: every touch changes the pod (a patch that changes nothing
    makes no event)."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
