"""What a decision needs to know of a node and of amounts, apart from planning: whether a node
takes pods at all (`unusable`: no ComputeNode, stale, DRA mode, NotReady), whether it would
refuse an assignment signed now (`lacks_key`), what a demand or a plan amounts to for
quotas, and the filter's `Verdict`. Pure functions of the snapshot and the demand, used by
the filter (`decisions`), bind and requeue alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hcsd.cluster.compute_quota import Amounts, Quota
from hcsd.cluster.demand import Demand
from hcsd.cluster.heartbeats import stale_reason
from hcsd.cluster.objects import NodeView
from hcsd.cluster.planner import Plan, Unfit
from hcsd.cluster.state import Snapshot
from hcsd.contract.dra import MODE_DRA, MODE_LABEL

__all__ = [
    "NOTHING", "Verdict", "floor_of", "lacks_key", "over_quota", "plan_amounts", "reason_of",
    "unusable",
]  # fmt: skip

NOTHING = Amounts()


@dataclass(frozen=True, slots=True)
class Verdict:
    """A filter's answer; its maps are not written after it is made (a refresh copies)."""

    version: int  # the snapshot version it reflects
    valid_until: float  # monotonic: the first heartbeat among passing nodes to expire
    failed: Mapping[str, str]
    scores: Mapping[str, int]  # the nodes that passed, in the order they were decided


def floor_of(demand: Demand) -> Amounts:
    """What the pod takes at least, wherever it lands."""
    return Amounts(
        demand.vram_floor,
        sum(c.tflops_fp16 or 0.0 for c in demand.containers),
        sum(c.devices for c in demand.containers),
    )


def over_quota(quotas: Sequence[Quota], used: Amounts, adding: Amounts) -> str | None:
    for quota in quotas:
        reason = quota.excess(used, adding)
        if reason is not None:
            return reason
    return None


def plan_amounts(found: Plan) -> Amounts:
    grants = found.all_grants
    return Amounts(sum(g.vram_bytes for g in grants), found.reserved_tflops, len(grants))


def reason_of(found: Plan | Unfit) -> str | None:
    return found.reason if isinstance(found, Unfit) else None


def unusable(snapshot: Snapshot, name: str, now: float) -> str | None:
    """Why no pod may go to the node whatever it asks, or None."""
    node = snapshot.nodes.get(name)
    if node is None:
        return "node has no ComputeNode (is hcs-syncer running on it?)"
    stale = stale_reason(snapshot.heartbeats.get(name), now)
    if stale is not None:
        return stale
    if node.view.mode == MODE_DRA:
        return (
            f"node is in DRA mode ({MODE_LABEL}={MODE_DRA}): its accelerators are allocated "
            "through ResourceClaims, not by the extender"
        )
    if node.view.phase == "NotReady":
        return "ComputeNode is NotReady (no healthy accelerator)"
    return None


def lacks_key(view: NodeView, signing: str) -> str | None:
    """Why the node would refuse an assignment signed now: its ComputeNode's
    status.assignmentKeys (what hcsd holds) lacks the signing key id. A status without the
    field (an older syncer) says nothing, and is not refused for it."""
    if not signing or view.key_ids is None or signing in view.key_ids:
        return None
    return (
        f"node does not hold the signing key {signing} yet (ComputeNode "
        "status.assignmentKeys): its hcs-syncer has not fetched it"
    )
