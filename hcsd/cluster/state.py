"""The extender's picture of the cluster: what each node has, who holds what, who is alive.

Four informers feed it: ComputeNodes, bound pods with assignments signed for them (with their
node's key of an id the cluster keyring holds), ComputeQuotas and the syncers' heartbeat
Leases; `Binder` adds what this process has just bound (the assume cache, in `holds.py`).
Decisions never read the live state: they take a `Snapshot`, which does not change however
the state moves on while they work. All in memory, rebuilt from the API server on start.

Locking: ONE lock, `ClusterState._lock`. It guards every field set under "guarded by _lock"
in `__init__`: the node views, the holds (assume cache), the heartbeats, the quotas, the
per-node snapshots with their shape ids, the change log and the last Snapshot. It is held for
one event's bookkeeping (informer threads, `assume`/`forget` from a bind) and by `snapshot()`
while it rebuilds the nodes changed since the last one (tens of microseconds a node) and
copies the maps that changed. Outside it run: the informers' list/watch I/O and transforms
(each informer's own cache is its business), every decision (over a Snapshot, which is never
written after it is made; see `NodeSnapshot.answers` for the one memo it carries), Binding
writes, and quota status writes. Nothing outside this module is called with the lock held.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hcsd.allocator import Usage
from hcsd.cluster.claim_usage import ClaimUsage
from hcsd.cluster.compute_quota import Amounts, Quota, quota_of
from hcsd.cluster.fabric_jobs import JobIndex, JobKey
from hcsd.cluster.fleet import FleetIndex, FleetRows
from hcsd.cluster.heartbeats import Heartbeat, Heartbeats, NodeLease, node_lease
from hcsd.cluster.holds import Holds, PodInfo, pod_info
from hcsd.cluster.informer import Informer
from hcsd.cluster.kube import Kube, paths_for
from hcsd.cluster.objects import NodeView, ObjectError, PodHold, node_view
from hcsd.cluster.pending import DEFAULT_SCHEDULERS, PENDING_COPIES, PendingCopies
from hcsd.cluster.planner import Summary, shape_of, summarise
from hcsd.cluster.runtime_profiles import RuntimeProfile, runtime_profile
from hcsd.contract.keyring import Keyring
from hcsd.contract.names import (
    API_VERSION,
    COMPUTE_NODES,
    COMPUTE_QUOTAS,
    NAMESPACE,
    RUNTIME_PROFILES,
)
from hcsd.model import Grant
from hcsd.profiles.exchange import share_tflops

__all__ = ["Answer", "ClusterState", "NodeSnapshot", "Snapshot"]

Answer = tuple[int, str, Amounts]  # score, why not ("" when the pod fits), what it would take

_SHAPES = 50_000  # distinct node shapes remembered before their ids are forgotten
_CHANGES = 100_000  # the change log reaches back this many node changes


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """One node as decided on: its view, its usage (view + holds not in its status yet), and
    what decisions key on. Replaced whole whenever the node or its holds change."""

    view: NodeView
    usage: Mapping[str, Usage]
    shape_id: int  # equal for nodes whose plans are equal (`planner.shape_of`)
    summary: Summary
    # Answers given on this snapshot, by demand id: a memo the decider fills. Each value is a
    # pure function of (this snapshot, the demand), so threads racing on it can only store
    # the same answer twice; it dies with the snapshot.
    answers: dict[int, Answer] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The state at one moment, for decisions. Its maps are never written after it is made."""

    version: int  # the change counter it reflects (see `ClusterState.changed_between`)
    nodes: Mapping[str, NodeSnapshot]
    heartbeats: Mapping[str, Heartbeat]
    quotas: tuple[Quota, ...]
    fleet: FleetIndex  # the same nodes and heartbeats as arrays, for vectorised decisions

    def quotas_in(self, namespace: str) -> list[Quota]:
        return [q for q in self.quotas if q.namespace == namespace]


def _view(obj: Mapping[str, Any]) -> NodeView:
    try:
        return node_view(obj)
    except ObjectError as e:
        raise ValueError(str(e)) from e


class ClusterState:
    def __init__(
        self,
        kube: Kube,
        *,
        keys: Callable[[], Keyring],
        namespace: str = NAMESPACE,
        clock: Callable[[], float] = time.time,
        schedulers: frozenset[str] = DEFAULT_SCHEDULERS,
        pending_copies: int = PENDING_COPIES,
        claims: bool = False,
        profiles: bool = True,
    ) -> None:
        self._lock = threading.Lock()
        # --- guarded by _lock ---
        self._views: dict[str, NodeView] = {}
        self._holds = Holds()
        self._tokens = itertools.count(1)  # names each bind's reservation
        self.monotonic = time.monotonic  # when Bindings are written, and their deadlines
        self._heartbeats = Heartbeats(clock)
        self._leased: set[str] = set()  # nodes whose heartbeat Lease exists now
        self._quotas: dict[str, Quota] = {}
        self._nodes: dict[str, NodeSnapshot] = {}  # copied on write: Snapshots share it
        self._dirty: set[str] = set()  # nodes whose NodeSnapshot is out of date
        self._shape_ids: dict[tuple[object, ...], int] = {}
        self._next_shape = itertools.count()  # never reused, so a stale id matches nothing
        self._version = 0  # counts node changes
        self._changes: deque[tuple[int, str]] = deque(maxlen=_CHANGES)
        self._last: Snapshot | None = None  # None: something changed since it was made
        self._beats: Mapping[str, Heartbeat] = {}  # the heartbeats as the last Snapshot has them
        self._beats_moved = True  # a heartbeat was recorded since
        self.jobs = JobIndex()  # job -> nodes of its pods, for fabric_placement (own lock)
        self._fleet = FleetRows()  # kept with the node snapshots and heartbeats
        self.copies = PendingCopies(pending_copies)  # which pods have a copy for bind (own lock)
        # --- the informers: each keeps its own cache and calls the handlers below ---
        self.nodes: Informer[NodeView] = Informer(
            kube, paths_for(API_VERSION, COMPUTE_NODES), _view,
            name=COMPUTE_NODES, on_change=self._node_changed,
        )  # fmt: skip
        self.pods: Informer[PodInfo] = Informer(
            kube, "/api/v1/pods",
            functools.partial(pod_info, keys=keys, schedulers=schedulers, admit=self.copies.admit),
            name="pods", on_change=self._pod_changed, on_listed=self._pods_listed,
        )  # fmt: skip
        self.quotas: Informer[Quota] = Informer(
            kube, paths_for(API_VERSION, COMPUTE_QUOTAS), quota_of,
            name=COMPUTE_QUOTAS, on_change=self._quota_changed,
        )  # fmt: skip
        self.leases: Informer[NodeLease] = Informer(
            kube, paths_for("coordination.k8s.io/v1", "leases", namespace), node_lease,
            name="leases", on_change=self._lease_changed,
        )  # fmt: skip
        # DRA mode: the allocated ResourceClaims count in ComputeQuota usage too
        self.claims = ClaimUsage(kube) if claims else None

        # RuntimeProfiles by name: read by decisions and bind (no lock of ours: the informer's
        # dict is replaced one key at a time). Not waited for at start (`informers`): a
        # cluster upgraded by helm lacks the CRD until the operator applies it (helm installs
        # CRDs, never upgrades them), and only pods naming a profile need it.
        self.profiles: Informer[RuntimeProfile] = Informer(
            kube, paths_for(API_VERSION, RUNTIME_PROFILES), runtime_profile,
            name=RUNTIME_PROFILES,
        )  # fmt: skip
        # profiles=False (--no-runtime-profiles): never started, so never listed (no RBAC).
        self._watched = (*self.informers, self.profiles) if profiles else self.informers

    @property
    def informers(self) -> tuple[Informer[Any], ...]:
        """The informers a decision needs synced: every one but the profiles'."""
        extra = (self.claims.informer,) if self.claims is not None else ()
        return (self.nodes, self.pods, self.quotas, self.leases, *extra)

    def start(self) -> ClusterState:
        for informer in self._watched:
            informer.start()
        return self

    def stop(self) -> None:
        for informer in self._watched:
            informer.stop()

    def runtime_profile(self, name: str) -> RuntimeProfile | None:
        """The RuntimeProfile of that name as the informer keeps it (None: none, or not
        listed yet: `profiles.synced` says which)."""
        return self.profiles.get(name)

    def wait_synced(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        return all(i.synced.wait(max(0.0, deadline - time.monotonic())) for i in self.informers)

    # --- handlers: one event each, under the lock -----------------------------------------

    def _touch(self, node: str) -> None:
        """The node's decisions are out of date: rebuild it at the next snapshot, log it."""
        self._dirty.add(node)
        self._version += 1
        self._changes.append((self._version, node))
        self._last = None

    def _node_changed(self, key: str, old: NodeView | None, new: NodeView | None) -> None:
        with self._lock:
            if new is None:
                self._views.pop(key, None)
                if key not in self._leased:
                    self._forget_beat(key)  # node and Lease both gone
            else:
                self._views[key] = new
            self._touch(key)

    def _pod_changed(self, key: str, old: PodInfo | None, new: PodInfo | None) -> None:
        self.copies.track(key, new is not None and new.pending is not None)
        with self._lock:
            for info in (old, new):
                if info is not None:
                    self.jobs.drop(info.uid)
            # What a bind assumed stays through updates of its pod still unbound (a label, a
            # status condition, the requeue's touch: they say nothing of what it is about to
            # hold), and goes when the pod is gone or another pod has its name.
            if old is not None and (new is None or new.node or new.uid != old.uid):
                for node in self._holds.drop(old.uid):
                    self._touch(node)
            if new is not None and new.node:
                for node in self._holds.put(new.uid, new.node, new.holds):
                    self._touch(node)
                if new.job is not None:
                    self.jobs.put(new.uid, new.job, new.node)

    def _quota_changed(self, key: str, old: Quota | None, new: Quota | None) -> None:
        with self._lock:
            if new is None:
                self._quotas.pop(key, None)
            else:
                self._quotas[key] = new
            self._last = None

    def _lease_changed(self, key: str, old: NodeLease | None, new: NodeLease | None) -> None:
        """The heartbeat handler: a renewal makes the node usable for its Lease's duration."""
        if new is None:
            if old is not None:
                with self._lock:
                    self._leased.discard(old.node)
                    if old.node not in self._views:
                        self._forget_beat(old.node)  # node and Lease both gone
            return  # the node stays: its last heartbeat ages out (see Heartbeats)
        with self._lock:
            self._leased.add(new.node)
            before = self._heartbeats.beats.get(new.node)
            if self._heartbeats.record(new, time.monotonic()):
                self._touch(new.node)
            if self._heartbeats.beats.get(new.node) is not before:  # not a relist's repeat
                self._fleet.beat(new.node, self._heartbeats.beats.get(new.node))
                self._beats_moved = True
                self._last = None

    def _forget_beat(self, node: str) -> None:
        """Under the lock: a node without ComputeNode nor Lease is gone; keeping its last
        heartbeat would keep it (and its series) forever."""
        if self._heartbeats.beats.pop(node, None) is not None:
            self._fleet.beat(node, None)
            self._beats_moved = True
            self._last = None

    # --- the assume cache, for Binder -----------------------------------------------------

    def assume(
        self, uid: str, node: str, holds: tuple[PodHold, ...], job: JobKey | None = None
    ) -> int | None:
        """Count a pod this process is binding before the informer shows it (and where its
        `job`'s pod went, for fabric placement); the token that names this reservation to
        `bound` and `forget`, or None when the pod has one already (it is bound, or another
        bind of it is in flight or not settled)."""
        with self._lock:
            token = next(self._tokens)
            touched = self._holds.assume(uid, node, holds, token)
            if touched is None:
                return None
            for node_name in touched:
                self._touch(node_name)
            if job is not None:
                self.jobs.put(uid, job, node)
            return token

    def bound(self, uid: str, token: int) -> None:
        """The Binding of an assumed pod is written: from now on the API server lists it."""
        at = self.monotonic()
        with self._lock:
            self._holds.bound(uid, token, at)

    def unsettled(self, uid: str, token: int, seconds: float) -> None:
        """The Binding of an assumed pod may or may not have been written (no answer): keep
        the reservation until the informer shows the pod, for `seconds` at most."""
        at = self.monotonic()
        with self._lock:
            self._holds.bound(uid, token, at, deadline=at + seconds)

    def _pods_listed(self, started: float) -> None:
        """Assumed pods a full list started after their Binding did not show are gone."""
        with self._lock:
            for node in self._holds.expire(started):
                self._touch(node)

    def forget(self, uid: str, token: int) -> None:
        """The Binding failed: the reservation `token` names holds nothing."""
        with self._lock:
            touched = self._holds.forget(uid, token)
            if touched:  # this bind's reservation (not the informer's word): its job goes too
                self.jobs.drop(uid)
            for touched_node in touched:
                self._touch(touched_node)

    # --- reading ---------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The state now, for a decision; the same object until something changes."""
        with self._lock:
            for node in self._holds.overdue(self.monotonic):
                self._touch(node)
            last = self._last
            if last is not None:
                return last
            if self._dirty:
                nodes = dict(self._nodes)
                for name in self._dirty:
                    view = self._views.get(name)
                    if view is None:
                        nodes.pop(name, None)
                        self._fleet.drop(name)
                    else:
                        nodes[name] = built = self._node_snapshot(view)
                        self._fleet.put(name, view, built.usage)
                self._dirty.clear()
                self._nodes = nodes
            if self._beats_moved:
                self._beats = dict(self._heartbeats.beats)
                self._beats_moved = False
            quotas = tuple(self._quotas.values())
            self._last = Snapshot(
                self._version, self._nodes, self._beats, quotas, self._fleet.freeze()
            )
            return self._last

    def _node_snapshot(self, view: NodeView) -> NodeSnapshot:
        usage = view.usage(self._holds.extra_on(view))
        shape = shape_of(view.devices, usage)
        if len(self._shape_ids) > _SHAPES:
            self._shape_ids.clear()
        shape_id = self._shape_ids.get(shape)
        if shape_id is None:
            shape_id = self._shape_ids[shape] = next(self._next_shape)
        return NodeSnapshot(view, usage, shape_id, summarise(view.devices, usage))

    def changed_between(self, older: int, newer: int) -> set[str] | None:
        """Nodes changed after version `older` up to `newer`; None when the log no longer
        reaches back that far."""
        if older == newer:
            return set()
        with self._lock:
            if not self._changes or self._changes[0][0] > older + 1:
                return None
            changed = set()
            for seen, node in reversed(self._changes):
                if seen <= older:
                    break
                if seen <= newer:
                    changed.add(node)
            return changed

    def namespace_usage(self, namespace: str, *, skip_uid: str = "") -> Amounts:
        """What the namespace's pods hold (but `skip_uid`'s), counted as quotas count it."""
        with self._lock:
            found = [
                (self._views.get(node), hold)
                for node, hold in self._holds.in_namespace(namespace, skip_uid=skip_uid)
            ]
        total = Amounts()
        for view, hold in found:
            total = total + amounts_of(view, hold.grants)
        if self.claims is not None:  # a NodeView is never changed, only replaced
            total = total + self.claims.namespace_amounts(namespace, self._views.get)
        return total

    def counts(self) -> tuple[int, int]:
        """(ComputeNodes, pods holding accelerators): for the gauges."""
        with self._lock:
            return len(self._views), len(self._holds)


def amounts_of(view: NodeView | None, grants: tuple[Grant, ...]) -> Amounts:
    """VRAM, reserved FP16 TFLOPS and devices of `grants` on the node seen as `view`."""
    devices = {d.uuid: d for d in view.devices} if view is not None else {}
    tflops = 0.0
    for g in grants:
        device = devices.get(g.device_uuid)
        if device is not None:
            tflops += share_tflops(device.tflops_fp16, g.compute_percent)
    return Amounts(sum(g.vram_bytes for g in grants), tflops, len(grants))
