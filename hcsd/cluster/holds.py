"""Who holds what on each node: pods with a signed assignment, and the assume cache.

The pods informer also keeps each unbound pod the extender may be asked to bind, with, for
`Binder`, a slim copy of it (`PodInfo.pending`, `pending.py`): what bind reads the pod's
demand from, without a GET.

Two sources feed `Holds`: the pods informer (a bound pod whose `hcs.io/assignment` verifies
for it and its node counts there until it succeeds, fails or is deleted), and this process's
own binds, assumed as soon as they are decided so that the next decision counts them before
the informer shows the pod (the assume cache). When the informer shows an assumed pod, its
entry is replaced by what the informer says. A grant that the node's ComputeNode status
already lists (hcsd has allocated it) is counted once, from the status: see
`Holds.extra_on`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hcsd.cluster.fabric_jobs import JobKey, job_of
from hcsd.cluster.objects import NodeView, PodHold
from hcsd.cluster.pending import DEFAULT_SCHEDULERS, bindable, pending_copy
from hcsd.contract import assignment
from hcsd.contract.keyring import Keyring, verifying_keys
from hcsd.contract.names import ANNOTATION_ASSIGNMENT

__all__ = ["Holds", "PodInfo", "pod_info"]


@dataclass(frozen=True, slots=True)
class PodInfo:
    """A pod holding accelerators (`node` set), or one waiting for them (`node` empty)."""

    uid: str
    namespace: str
    name: str
    node: str  # "": not bound, holds nothing
    holds: tuple[PodHold, ...]
    job: JobKey | None = None  # the job it belongs to (fabric_jobs.job_of)
    pending: Mapping[str, Any] | None = None  # an unbound pod's `pending_copy`, if kept


def pod_info(
    obj: Mapping[str, Any],
    keys: Callable[[], Keyring],
    *,
    schedulers: frozenset[str] = DEFAULT_SCHEDULERS,
    admit: Callable[[str], bool] | None = None,
) -> PodInfo | None:
    """Pods that hold accelerators: bound, not ended, with an assignment signed for this
    pod's uid and the node it is bound to with that node's key of an id the cluster keyring
    `keys` holds (what hcsd accepts, so what can hold a device), or, for version 1 (pods
    bound before the upgrade), with the old cluster key as it is; unbound pods this extender
    may bind (`pending.bindable` for `schedulers`), holding nothing, with their
    `pending_copy` when it can be had and `admit` (the cap on copies, by informer key)
    lets it be kept; None for all others.

    Annotations are anyone's to write who may update the pod: an unsigned, copied or
    hand-edited assignment holds nothing on a node, so it must neither fill the node in the
    extender's view nor count in the namespace's ComputeQuota. Its age does not matter here:
    a pod keeps what it got for as long as it runs.
    """
    meta = obj.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(ANNOTATION_ASSIGNMENT)
    node = (obj.get("spec") or {}).get("nodeName") or ""
    phase = (obj.get("status") or {}).get("phase", "")
    uid = str(meta.get("uid") or "")
    if not node and phase not in ("Succeeded", "Failed"):
        if not bindable(obj, schedulers):
            return None
        # Waiting to be bound: holds nothing, whatever it claims.
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        copy = pending_copy(obj)
        if copy is not None and admit is not None and not admit(f"{namespace}/{name}"):
            copy = None  # too many copies: bind GETs this one
        return PodInfo(uid, namespace, name, "", (), pending=copy)
    if not text or not node or phase in ("Succeeded", "Failed"):
        return None
    try:
        assigned = assignment.verify(
            text,
            verifying_keys(keys(), node),
            node=node,
            pod_uid=uid,
            now=time.time(),
            max_age=math.inf,
        )
    except assignment.AssignmentError as e:
        raise ValueError(f"{ANNOTATION_ASSIGNMENT} does not count: {e}") from e
    namespace = str(meta.get("namespace", ""))
    holds = tuple(
        PodHold(uid, container, namespace, grants)
        for container, grants in assigned.containers.items()
    )
    return PodInfo(uid, namespace, str(meta.get("name", "")), node, holds, job_of(obj))


@dataclass(slots=True)
class Assumed:
    """One bind's reservation: `token` names the bind that made it (so that only it is ever
    forgotten by that bind), `written` when its Binding was written (monotonic; None: not
    yet), `deadline` when it goes unless the informer shows the pod (None: none; set when the
    Binding's outcome is unknown)."""

    token: int
    written: float | None = None
    deadline: float | None = None


class Holds:
    """Pod uid -> (node, holds), indexed per node, and which of them are only assumed.

    An assumed pod stays until the informer shows it (then the informer's word replaces it),
    its Binding fails (`forget`, with the token of the bind that assumed it), a full list
    that started after its Binding was written does not show it (`expire`: it was deleted or
    ended before the informer saw it bound, and the watch events that would have said so were
    lost with a broken watch), or, for a Binding whose outcome is unknown, its deadline passes
    (`overdue`). An assumption never replaces an entry: not the informer's (the pod holds
    that), nor another bind's (in flight, or not settled yet).

    Not locked on its own: `ClusterState` calls it under its lock. Each change returns the
    nodes it touched, whose decisions are then out of date.
    """

    def __init__(self) -> None:
        self._by_pod: dict[str, tuple[str, tuple[PodHold, ...]]] = {}
        self._by_node: dict[str, dict[str, PodHold]] = {}  # node -> hold key -> hold
        self._assumed: dict[str, Assumed] = {}  # uid -> the bind's reservation
        self._unsettled: set[str] = set()  # uids assumed with a deadline

    def __len__(self) -> int:
        return len(self._by_pod)

    def __contains__(self, uid: object) -> bool:
        return uid in self._by_pod

    def put(self, uid: str, node: str, holds: tuple[PodHold, ...]) -> list[str]:
        """The informer's word: the pod holds `holds` on `node` (replacing what it held or
        was assumed to hold before, wherever)."""
        touched = self.drop(uid)
        return [*touched, *self._add(uid, node, holds)]

    def assume(
        self, uid: str, node: str, holds: tuple[PodHold, ...], token: int
    ) -> list[str] | None:
        """A bind's reservation, before the informer shows the pod; None (nothing changed)
        when the pod has an entry already."""
        if uid in self._by_pod:
            return None
        self._assumed[uid] = Assumed(token)
        return self._add(uid, node, holds)

    def _add(self, uid: str, node: str, holds: tuple[PodHold, ...]) -> list[str]:
        bucket = self._by_node.setdefault(node, {})
        for hold in holds:
            bucket[hold.key] = hold
        self._by_pod[uid] = (node, holds)
        return [node]

    def _mine(self, uid: str, token: int) -> Assumed | None:
        found = self._assumed.get(uid)
        return found if found is not None and found.token == token else None

    def bound(self, uid: str, token: int, at: float, *, deadline: float | None = None) -> None:
        """The assumed pod's Binding was written at monotonic `at`; with `deadline`, its
        outcome is unknown and the reservation goes then unless the informer shows it."""
        found = self._mine(uid, token)
        if found is not None:
            found.written, found.deadline = at, deadline
            if deadline is not None:
                self._unsettled.add(uid)

    def forget(self, uid: str, token: int) -> list[str]:
        """The bind that assumed the pod with `token` failed: drop that reservation (and
        nothing else: not the informer's entry, nor another bind's)."""
        return self.drop(uid) if self._mine(uid, token) is not None else []

    def expire(self, listed_from: float) -> list[str]:
        """Drop assumed pods bound before a full list that started at `listed_from` and did
        not show them (a pod it showed is no longer assumed)."""
        gone = [
            uid
            for uid, a in self._assumed.items()
            if a.written is not None and a.written < listed_from
        ]
        return [node for uid in gone for node in self.drop(uid)]

    def overdue(self, clock: Callable[[], float]) -> list[str]:
        """Drop the reservations of Bindings of unknown outcome whose deadline (on `clock`,
        read only when there are some) has passed without the informer showing their pod."""
        if not self._unsettled:
            return []
        now = clock()
        gone = [u for u in self._unsettled if (self._assumed[u].deadline or 0.0) < now]
        return [node for uid in gone for node in self.drop(uid)]

    def drop(self, uid: str) -> list[str]:
        """The pod holds nothing any more."""
        self._assumed.pop(uid, None)
        self._unsettled.discard(uid)
        found = self._by_pod.pop(uid, None)
        if found is None:
            return []
        node, holds = found
        bucket = self._by_node.get(node, {})
        for hold in holds:
            bucket.pop(hold.key, None)
        if not bucket:
            self._by_node.pop(node, None)
        return [node]

    def extra_on(self, view: NodeView) -> list[PodHold]:
        """Holds on the node that its ComputeNode status does not list yet."""
        bucket = self._by_node.get(view.name)
        if not bucket:
            return []
        return [hold for key, hold in bucket.items() if key not in view.holds]

    def in_namespace(self, namespace: str, *, skip_uid: str = "") -> list[tuple[str, PodHold]]:
        """(node, hold) of every pod in `namespace` but `skip_uid` (the pod being decided)."""
        return [
            (node, hold)
            for uid, (node, holds) in self._by_pod.items()
            if uid != skip_uid
            for hold in holds
            if hold.namespace == namespace
        ]
