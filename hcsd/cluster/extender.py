"""The scheduler extender's decisions: filter, prioritize and bind over informer caches.

State, all in memory and rebuilt from the API server on start:
- ComputeNodes (what each node has and what hcsd says is held), node heartbeat Leases,
  ComputeQuotas, and the pods that carry an assignment;
- `pending`: grants of assigned pods per node, including those this process just bound and
  the informers have not shown yet (the assume cache). A grant already in the node's
  ComputeNode status is counted once, from the status.
Filter and prioritize never write. Bind is serialised: it re-plans against the latest state,
so two pods racing for the last slice cannot both get it; the loser's bind fails and
kube-scheduler tries it again, where the filter now tells it why not.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hcsd.allocator import Usage
from hcsd.cluster.demand import Demand, DemandError, demand_of
from hcsd.cluster.informer import Informer
from hcsd.cluster.kube import Kube, KubeError, paths_for
from hcsd.cluster.metrics import Metrics
from hcsd.cluster.objects import NodeView, ObjectError, PodHold, node_view
from hcsd.cluster.planner import (
    Plan,
    Summary,
    Unfit,
    expand_models,
    plan,
    quick_fit,
    shape_of,
    summarise,
)
from hcsd.cluster.quota import Amounts, Quota, quota_of
from hcsd.cluster.timefmt import parse_time
from hcsd.contract import assignment
from hcsd.contract.names import (
    ANNOTATION_ASSIGNMENT,
    API_VERSION,
    COMPUTE_NODES,
    COMPUTE_QUOTAS,
    NAMESPACE,
    NODE_LEASE_PREFIX,
)
from hcsd.model import Grant
from hcsd.profiles.database import ProfileDatabase
from hcsd.profiles.exchange import share_tflops

__all__ = ["Extender", "PodInfo"]

log = logging.getLogger(__name__)

_PLAN_CACHE = 50_000


@dataclass(frozen=True, slots=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    node: str
    holds: tuple[PodHold, ...]


def pod_info(obj: Mapping[str, Any]) -> PodInfo | None:
    """Pods that hold accelerators through an assignment; None for all others."""
    meta = obj.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(ANNOTATION_ASSIGNMENT)
    node = (obj.get("spec") or {}).get("nodeName") or ""
    phase = (obj.get("status") or {}).get("phase", "")
    if not text or phase in ("Succeeded", "Failed"):
        return None
    try:
        assigned = assignment.parse(text)
        uid = str(meta["uid"])
    except (assignment.AssignmentError, KeyError) as e:
        raise ValueError(f"unreadable {ANNOTATION_ASSIGNMENT}: {e}") from e
    namespace = str(meta.get("namespace", ""))
    holds = tuple(
        PodHold(uid, container, namespace, grants)
        for container, grants in assigned.containers.items()
    )
    return PodInfo(uid, namespace, str(meta.get("name", "")), node or assigned.node, holds)


class _NodeState:
    """One node as decided on: its usage (holds + pending), shape, summary, and the answers
    given per demand since it last changed. Replaced whole on any change of the node."""

    __slots__ = ("answers", "shape_id", "summary", "usage", "view")

    def __init__(self, view: NodeView, usage: dict[str, Usage], shape_id: int, summary: Summary):
        self.view = view
        self.usage = usage
        self.shape_id = shape_id
        self.summary = summary
        self.answers: dict[int, tuple[int, str, Amounts]] = {}  # demand id -> score, why, amounts


@dataclass
class _Result:
    """A filter answer for one demand over one list of nodes, patched as nodes change."""

    version: int  # the change counter it reflects
    valid_until: float  # monotonic: the first heartbeat among passing nodes to expire
    failed: dict[str, str]
    scores: dict[str, int]


@dataclass
class _Heartbeat:
    renewed: float  # local monotonic time the renewal was seen
    duration: float
    stamp: str


class Extender:
    def __init__(
        self,
        kube: Kube,
        key: bytes,
        db: ProfileDatabase,
        *,
        namespace: str = NAMESPACE,
        is_leader: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.key = key
        self.db = db
        self.namespace = namespace
        self.is_leader = is_leader
        self.clock = clock
        self.metrics = Metrics()
        self.heartbeats: dict[str, _Heartbeat] = {}
        self._lock = threading.RLock()  # pending, usage cache
        self._bind_lock = threading.Lock()
        self._filter_lock = threading.Lock()  # cached results are patched in place
        self.pending: dict[str, dict[str, PodHold]] = {}  # node -> hold key -> hold
        self._pod_nodes: dict[str, tuple[str, tuple[PodHold, ...]]] = {}  # uid -> node, holds
        self._usage: dict[str, _NodeState] = {}
        self._plans: OrderedDict[tuple[int, int], Plan | Unfit] = OrderedDict()
        self._shape_ids: dict[tuple[object, ...], int] = {}
        self._version = 0  # counts changes of any node's state
        self._changes: deque[tuple[int, str]] = deque(maxlen=100_000)
        self._results: OrderedDict[tuple[int, int], _Result] = OrderedDict()
        self._demand_ids: dict[Demand, int] = {}
        self._last: tuple[str, dict[str, int]] = ("", {})  # pod uid, node -> score
        self._first_seen: dict[str, float] = {}
        # Pods as kube-scheduler sent them to filter, by uid: bind needs no GET.
        self._seen: OrderedDict[str, Mapping[str, Any]] = OrderedDict()
        self.nodes: Informer[NodeView] = Informer(
            kube,
            paths_for(API_VERSION, COMPUTE_NODES),
            self._node_view,
            name=COMPUTE_NODES,
            on_change=self._node_changed,
        )
        self.pods: Informer[PodInfo] = Informer(
            kube, "/api/v1/pods", pod_info, name="pods", on_change=self._pod_changed
        )
        self.quotas: Informer[Quota] = Informer(
            kube, paths_for(API_VERSION, COMPUTE_QUOTAS), quota_of, name=COMPUTE_QUOTAS
        )
        self.leases: Informer[_Heartbeat] = Informer(
            kube,
            paths_for("coordination.k8s.io/v1", "leases", namespace),
            self._heartbeat,
            name="leases",
        )

    # --- caches ------------------------------------------------------------------------

    def start(self) -> Extender:
        for informer in (self.nodes, self.pods, self.quotas, self.leases):
            informer.start()
        return self

    def stop(self) -> None:
        for informer in (self.nodes, self.pods, self.quotas, self.leases):
            informer.stop()

    def wait_synced(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        return all(
            i.synced.wait(max(0.0, deadline - time.monotonic()))
            for i in (self.nodes, self.pods, self.quotas, self.leases)
        )

    @staticmethod
    def _node_view(obj: Mapping[str, Any]) -> NodeView:
        try:
            return node_view(obj)
        except ObjectError as e:
            raise ValueError(str(e)) from e

    def _node_changed(self, key: str, old: NodeView | None, new: NodeView | None) -> None:
        self._invalidate(key)

    def _invalidate(self, node: str) -> None:
        """The node's answers are out of date: drop its state and log the change."""
        with self._lock:
            self._usage.pop(node, None)
            self._version += 1
            self._changes.append((self._version, node))

    def _changed_since(self, version: int) -> set[str] | None:
        """Nodes changed after `version`; None when the log no longer reaches back."""
        with self._lock:
            if self._version == version:
                return set()
            if not self._changes or self._changes[0][0] > version + 1:
                return None
            changed = set()
            for seen, node in reversed(self._changes):
                if seen <= version:
                    break
                changed.add(node)
            return changed

    def _heartbeat(self, obj: Mapping[str, Any]) -> _Heartbeat | None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if not name.startswith(NODE_LEASE_PREFIX):
            return None
        spec = obj.get("spec") or {}
        stamp = str(spec.get("renewTime", ""))
        duration = float(spec.get("leaseDurationSeconds") or 40)
        node = name[len(NODE_LEASE_PREFIX) :]
        before = self.heartbeats.get(node)
        if before is not None and before.stamp == stamp:
            return before
        renewed_wall = parse_time(stamp)
        now = time.monotonic()
        if before is None and renewed_wall is not None:
            # First sight (a list at start): trust the stamp, measured against our clock.
            renewed = now - max(0.0, self.clock() - renewed_wall)
        else:
            renewed = now  # a renewal seen now: no clock skew between nodes involved
        beat = _Heartbeat(renewed, duration, stamp)
        self.heartbeats[node] = beat
        if before is None or now - before.renewed > before.duration:
            self._invalidate(node)  # it comes back to life: cached answers said "stale"
        return beat

    def _pod_changed(self, key: str, old: PodInfo | None, new: PodInfo | None) -> None:
        with self._lock:
            for info in (old, new):
                if info is not None:
                    self._forget_pod(info.uid)
            if new is not None and new.node:
                self._hold(new.uid, new.node, new.holds)

    def _hold(self, uid: str, node: str, holds: tuple[PodHold, ...]) -> None:
        self._forget_pod(uid)
        bucket = self.pending.setdefault(node, {})
        for hold in holds:
            bucket[hold.key] = hold
        self._pod_nodes[uid] = (node, holds)
        self._invalidate(node)

    def _forget_pod(self, uid: str) -> None:
        found = self._pod_nodes.pop(uid, None)
        if found is None:
            return
        node, holds = found
        bucket = self.pending.get(node, {})
        for hold in holds:
            bucket.pop(hold.key, None)
        self._invalidate(node)

    def _node_state(self, view: NodeView) -> _NodeState:
        state = self._usage.get(view.name)
        if state is not None and state.view is view:
            return state
        with self._lock:
            extra = [h for k, h in self.pending.get(view.name, {}).items() if k not in view.holds]
            usage = view.usage(extra)
            shape = shape_of(view.devices, usage)
            if len(self._shape_ids) > _PLAN_CACHE:
                self._shape_ids.clear()
                self._plans.clear()
            shape_id = self._shape_ids.setdefault(shape, len(self._shape_ids))
            state = _NodeState(view, usage, shape_id, summarise(view.devices, usage))
            self._usage[view.name] = state
            return state

    def _demand_id(self, demand: Demand) -> int:
        """A small number per distinct demand: cheap keys for the per-node answer caches."""
        found = self._demand_ids.get(demand)
        if found is None:
            if len(self._demand_ids) > _PLAN_CACHE:
                self._demand_ids.clear()
                self._plans.clear()
                for state in list(self._usage.values()):
                    state.answers.clear()
            found = self._demand_ids.setdefault(demand, len(self._demand_ids))
        return found

    # --- decisions ---------------------------------------------------------------------

    def _stale(self, name: str) -> str | None:
        beat = self.heartbeats.get(name)
        if beat is None:
            return "no hcs heartbeat Lease (is hcs-syncer running on the node?)"
        age = time.monotonic() - beat.renewed
        if age > beat.duration:
            return (
                f"hcs heartbeat is {age:.0f}s old (limit {beat.duration:.0f}s): "
                "hcsd or hcs-syncer is down"
            )
        return None

    def _unusable(self, name: str) -> str | None:
        view = self.nodes.items.get(name)
        if view is None:
            return "node has no ComputeNode (is hcs-syncer running on it?)"
        stale = self._stale(name)
        if stale is not None:
            return stale
        if view.phase == "NotReady":
            return "ComputeNode is NotReady (no healthy accelerator)"
        return None

    def evaluate(self, demand: Demand, name: str, *, cached: bool = True) -> Plan | Unfit:
        """The allocator's full answer for the pod on this node (bind uses it uncached)."""
        why = self._unusable(name)
        if why is not None:
            return Unfit(why)
        state = self._node_state(self.nodes.items[name])
        if not cached:
            return plan(demand, state.view.devices, state.usage, self.db)
        key = (state.shape_id, self._demand_id(demand))
        found = self._plans.get(key)
        if found is None:
            found = plan(demand, state.view.devices, state.usage, self.db)
            self._plans[key] = found
            if len(self._plans) > _PLAN_CACHE:
                self._plans.popitem(last=False)
        return found

    def namespace_usage(self, namespace: str, *, skip_uid: str = "") -> Amounts:
        total = Amounts()
        with self._lock:
            items = [
                (node, holds) for uid, (node, holds) in self._pod_nodes.items() if uid != skip_uid
            ]
        for node, holds in items:
            for hold in holds:
                if hold.namespace == namespace:
                    total = total + self._amounts(node, hold.grants)
        return total

    def _amounts(self, node: str, grants: tuple[Grant, ...]) -> Amounts:
        view = self.nodes.get(node)
        devices = {d.uuid: d for d in view.devices} if view is not None else {}
        tflops = 0.0
        for g in grants:
            device = devices.get(g.device_uuid)
            if device is not None:
                tflops += share_tflops(device.tflops_fp16, g.compute_percent)
        return Amounts(sum(g.vram_bytes for g in grants), tflops, len(grants))

    def _quotas(self, namespace: str) -> list[Quota]:
        return [q for q in list(self.quotas.items.values()) if q.namespace == namespace]

    def _demand(self, pod: Mapping[str, Any]) -> Demand | None:
        demand = demand_of(pod)
        if demand is not None and demand.models:
            demand = dataclasses.replace(demand, models=expand_models(demand.models, self.db))
        return demand

    def filter(self, args: Mapping[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            return self._filter(args)
        finally:
            self.metrics.observe("filter", time.perf_counter() - started)

    def _filter(self, args: Mapping[str, Any]) -> dict[str, Any]:
        pod = args.get("Pod") or {}
        names = list(
            args.get("NodeNames")
            or [n["metadata"]["name"] for n in (args.get("Nodes") or {}).get("items", [])]
        )
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        self._first_seen.setdefault(uid, time.monotonic())
        if len(self._first_seen) > 10_000:
            self._first_seen.clear()
        self._seen[uid] = pod
        if len(self._seen) > 10_000:
            self._seen.popitem(last=False)
        try:
            demand = self._demand(pod)
        except DemandError as e:
            self.metrics.refusals["bad_request"] += len(names)
            return _filter_result([], {n: str(e) for n in names})
        if demand is None:
            return _filter_result(names, {})
        quotas = self._quotas(demand.namespace)
        used = self.namespace_usage(demand.namespace, skip_uid=uid) if quotas else Amounts()
        floor = _floor(demand)
        for quota in quotas:
            reason = quota.excess(used, floor)
            if reason is not None:
                self.metrics.refusals["quota"] += len(names)
                return _filter_result([], {n: reason for n in names})
        demand_id = self._demand_id(demand)
        if quotas:
            result = self._compute(demand, demand_id, names, quotas, used)
        else:
            with self._filter_lock:
                result = self._cached_result(demand, demand_id, names)
                result = _Result(
                    result.version, result.valid_until, dict(result.failed), dict(result.scores)
                )
        if result.failed:
            self.metrics.refusals["unfit"] += len(result.failed)
        self._last = (uid, result.scores)
        return _filter_result(list(result.scores), result.failed)

    def _compute(
        self,
        demand: Demand,
        demand_id: int,
        names: list[str],
        quotas: list[Quota],
        used: Amounts,
    ) -> _Result:
        version = self._version
        now = time.monotonic()
        result = _Result(version, math.inf, {}, {})
        for name in names:
            self._patch(result, demand, demand_id, name, now=now, quotas=quotas, used=used)
        return result

    def _patch(
        self,
        result: _Result,
        demand: Demand,
        demand_id: int,
        name: str,
        *,
        now: float,
        quotas: list[Quota],
        used: Amounts,
    ) -> None:
        score, reason, amounts = self._answer(demand, demand_id, name, now)
        if not reason and quotas:
            reason = _over_quota(quotas, used, amounts) or ""
        if reason:
            result.failed[name] = reason
            result.scores.pop(name, None)
        else:
            result.failed.pop(name, None)
            result.scores[name] = score
            beat = self.heartbeats[name]
            result.valid_until = min(result.valid_until, beat.renewed + beat.duration)

    def _cached_result(self, demand: Demand, demand_id: int, names: list[str]) -> _Result:
        """The last answer for this demand and node list, with changed nodes re-decided.

        kube-scheduler sends the same node list pod after pod, and pods of one job ask the
        same thing: between two of them only the nodes that changed need a decision."""
        key = (demand_id, hash(tuple(names)))
        cached = self._results.get(key)
        now = time.monotonic()
        if cached is not None and now < cached.valid_until:
            version = self._version
            changed = self._changed_since(cached.version)
            if changed is not None:
                for name in changed:
                    if name in cached.scores or name in cached.failed:
                        self._patch(
                            cached, demand, demand_id, name, now=now, quotas=[], used=_NOTHING
                        )
                cached.version = version
                self._results.move_to_end(key)
                return cached
        result = self._compute(demand, demand_id, names, [], _NOTHING)
        self._results[key] = result
        if len(self._results) > 256:
            self._results.popitem(last=False)
        return result

    def _answer(
        self, demand: Demand, demand_id: int, name: str, now: float
    ) -> tuple[int, str, Amounts]:
        """(score, "", amounts) when the pod fits on the node, else (0, why not, nothing).

        The hot path of a filter over thousands of nodes: an unchanged node answers a demand
        it has seen from its cache; a new demand of the common kind is a binary search."""
        view = self.nodes.items.get(name)
        state = self._usage.get(name)
        beat = self.heartbeats.get(name)
        if (
            view is None
            or beat is None
            or now - beat.renewed > beat.duration
            or view.phase == "NotReady"
        ):
            return 0, self._unusable(name) or "node is not usable", _NOTHING
        if state is None or state.view is not view:
            state = self._node_state(view)
        answer = state.answers.get(demand_id)
        if answer is not None:
            return answer
        quick = quick_fit(demand, state.summary)
        if quick is not None:
            score, reason = quick
            # The quick path grants one slice and reserves no compute: the demand's floor.
            answer = (0, reason, _NOTHING) if score < 0 else (score, "", _floor(demand))
        else:
            found = self.evaluate(demand, name)
            if isinstance(found, Unfit):
                answer = (0, found.reason, _NOTHING)
            else:
                answer = (found.score, "", self._plan_amounts(found))
        if len(state.answers) > 64:
            state.answers.clear()
        state.answers[demand_id] = answer
        return answer

    @staticmethod
    def _plan_amounts(found: Plan) -> Amounts:
        grants = found.all_grants
        return Amounts(sum(g.vram_bytes for g in grants), found.reserved_tflops, len(grants))

    def prioritize(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        started = time.perf_counter()
        try:
            pod = args.get("Pod") or {}
            uid = str((pod.get("metadata") or {}).get("uid", ""))
            names = list(args.get("NodeNames") or [])
            last_uid, known = self._last
            if last_uid != uid:
                known = {}
            try:
                demand = self._demand(pod)
            except DemandError:
                demand = None
            scores = []
            for name in names:
                score = known.get(name)
                if score is None and demand is not None:
                    found = self.evaluate(demand, name)
                    score = found.score if isinstance(found, Plan) else 0
                scores.append({"Host": name, "Score": score or 0})
            return scores
        finally:
            self.metrics.observe("prioritize", time.perf_counter() - started)

    def bind(self, args: Mapping[str, Any]) -> dict[str, str]:
        started = time.perf_counter()
        try:
            error = self._bind(args)
        except KubeError as e:
            error = f"bind failed: {e}"
        finally:
            self.metrics.observe("bind", time.perf_counter() - started)
        self.metrics.binds["ok" if not error else "error"] += 1
        if error:
            log.warning(
                "bind %s/%s to %s: %s",
                args.get("PodNamespace"),
                args.get("PodName"),
                args.get("Node"),
                error,
            )
        return {"Error": error}

    def _bind(self, args: Mapping[str, Any]) -> str:
        if not self.is_leader():
            return "this hcs-scheduler-extender replica is not the leader"
        namespace = str(args.get("PodNamespace", ""))
        name = str(args.get("PodName", ""))
        uid = str(args.get("PodUID", ""))
        node = str(args.get("Node", ""))
        pod_path = paths_for("v1", "pods", namespace, name)
        pod = self._seen.get(uid) or self.kube.get(pod_path)
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or uid)
        try:
            demand = self._demand(pod)
        except DemandError as e:
            return str(e)
        binding: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        holds: tuple[PodHold, ...] = ()
        if demand is not None:
            with self._bind_lock:  # decide and assume under the lock; write outside it
                found = self.evaluate(demand, node, cached=False)
                if isinstance(found, Unfit):
                    return f"node {node} can no longer take the pod: {found.reason}"
                used = self.namespace_usage(namespace, skip_uid=uid)
                reason = _over_quota(self._quotas(namespace), used, self._plan_amounts(found))
                if reason is not None:
                    return reason
                holds = tuple(PodHold(uid, c, namespace, g) for c, g in found.grants.items())
                with self._lock:
                    self._hold(uid, node, holds)
            signed = assignment.encode(
                assignment.Assignment(node, uid, self.clock(), found.grants), self.key
            )
            # The API server copies a Binding's annotations onto the pod in the same write, so
            # a pod is never bound without its assignment, nor annotated without a node.
            binding["metadata"]["annotations"] = {ANNOTATION_ASSIGNMENT: signed}
        try:
            self.kube.create(pod_path + "/binding", binding)
        except KubeError:
            if holds:
                with self._lock:
                    self._forget_pod(uid)
            raise
        self._seen.pop(uid, None)
        first = self._first_seen.pop(uid, None)
        if first is not None:
            self.metrics.scheduling.observe(time.monotonic() - first)
        log.info(
            "bound %s/%s to %s%s",
            namespace,
            name,
            node,
            f" ({sum(len(h.grants) for h in holds)} grant(s))" if holds else "",
        )
        return ""

    # --- quota status ------------------------------------------------------------------

    def write_quota_status(self) -> int:
        """Write each ComputeQuota's `status.used` where it changed; the number written."""
        written = 0
        for quota in list(self.quotas.items.values()):
            used = self.namespace_usage(quota.namespace).as_status()
            if dict(quota.status_used) == used:
                continue
            path = paths_for(API_VERSION, COMPUTE_QUOTAS, quota.namespace, quota.name) + "/status"
            try:
                self.kube.patch(path, {"status": {"used": used}})
                written += 1
            except KubeError as e:
                log.warning(
                    "cannot write the status of ComputeQuota %s/%s: %s",
                    quota.namespace,
                    quota.name,
                    e,
                )
        return written

    def gauges(self) -> dict[str, float]:
        return {
            "hcs_extender_compute_nodes": float(len(self.nodes.items)),
            "hcs_extender_assigned_pods": float(len(self._pod_nodes)),
            "hcs_extender_leader": 1.0 if self.is_leader() else 0.0,
        }


_NOTHING = Amounts()


def _floor(demand: Demand) -> Amounts:
    """What the pod takes at least, wherever it lands."""
    return Amounts(
        demand.vram_floor,
        sum(c.tflops_fp16 or 0.0 for c in demand.containers),
        sum(c.devices for c in demand.containers),
    )


def _over_quota(quotas: list[Quota], used: Amounts, adding: Amounts) -> str | None:
    for quota in quotas:
        reason = quota.excess(used, adding)
        if reason is not None:
            return reason
    return None


def _filter_result(passed: list[str], failed: Mapping[str, str]) -> dict[str, Any]:
    return {
        "Nodes": None,
        "NodeNames": passed,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
