"""Bind: re-plan the pod on the node kube-scheduler chose, assume it, sign, post the Binding.

Binds are serialised (`Binder._lock`): each one re-plans against the latest state, which
includes the binds before it, so two pods racing for the last slice cannot both get it; the
loser's bind fails and kube-scheduler tries the pod again, where the filter now says why not.
The grants are assumed before the Binding is written (and forgotten if the write fails), so
no decision in between can hand them out again.

The API server copies a Binding's annotations onto the pod in the same write, so a pod is
never bound without its assignment, nor annotated for a node it did not get.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hcsd.cluster.decisions import Decider, over_quota, plan_amounts
from hcsd.cluster.demand import DemandError
from hcsd.cluster.extender_metrics import Metrics
from hcsd.cluster.kube import Kube, KubeError, paths_for
from hcsd.cluster.objects import PodHold
from hcsd.cluster.planner import Unfit
from hcsd.cluster.state import ClusterState
from hcsd.contract import assignment
from hcsd.contract.names import ANNOTATION_ASSIGNMENT
from hcsd.model import Grant

__all__ = ["BindRequest", "Binder", "SeenPods", "signed_assignment"]

log = logging.getLogger(__name__)

_SEEN = 10_000


@dataclass(frozen=True, slots=True)
class BindRequest:
    namespace: str
    name: str
    uid: str
    node: str


def signed_assignment(
    node: str, pod_uid: str, grants: Mapping[str, tuple[Grant, ...]], key: bytes, issued: float
) -> str:
    """The `hcs.io/assignment` annotation: what each container got, signed for hcsd."""
    return assignment.encode(assignment.Assignment(node, pod_uid, issued, grants), key)


class SeenPods:
    """Pods as kube-scheduler sent them to filter, by uid (bind then needs no GET), and when
    each was first filtered (for the scheduling latency metric). Both bounded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _pods and _first; held for a dict operation
        self._pods: OrderedDict[str, Mapping[str, Any]] = OrderedDict()
        self._first: dict[str, float] = {}

    def remember(self, uid: str, pod: Mapping[str, Any]) -> None:
        with self._lock:
            self._first.setdefault(uid, time.monotonic())
            if len(self._first) > _SEEN:
                self._first.clear()
            self._pods[uid] = pod
            if len(self._pods) > _SEEN:
                self._pods.popitem(last=False)

    def pod(self, uid: str) -> Mapping[str, Any] | None:
        with self._lock:
            return self._pods.get(uid)

    def bound(self, uid: str) -> float | None:
        """Forget the pod; when it was first filtered (monotonic), if known."""
        with self._lock:
            self._pods.pop(uid, None)
            return self._first.pop(uid, None)


class Binder:
    def __init__(
        self,
        kube: Kube,
        key: bytes,
        state: ClusterState,
        decider: Decider,
        metrics: Metrics,
        *,
        is_leader: Callable[[], bool],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.key = key
        self.state = state
        self.decider = decider
        self.metrics = metrics
        self.is_leader = is_leader
        self.clock = clock
        self.seen = SeenPods()
        self._lock = threading.Lock()  # one bind decides and assumes at a time

    def bind(self, request: BindRequest) -> str:
        """Bind the pod; "" when bound, else why not (kube-scheduler will try again)."""
        started = time.perf_counter()
        try:
            error = self._bind(request)
        except KubeError as e:
            error = f"bind failed: {e}"
        finally:
            self.metrics.observe("bind", time.perf_counter() - started)
        self.metrics.binds["ok" if not error else "error"] += 1
        if error:
            log.warning(
                "bind %s/%s to %s: %s", request.namespace, request.name, request.node, error
            )
        return error

    def _bind(self, request: BindRequest) -> str:
        if not self.is_leader():
            return "this hcs-scheduler-extender replica is not the leader"
        namespace, name, node = request.namespace, request.name, request.node
        pod_path = paths_for("v1", "pods", namespace, name)
        pod = self.seen.pod(request.uid) or self.kube.get(pod_path)
        uid = str((pod.get("metadata") or {}).get("uid") or request.uid)
        try:
            demand = self.decider.demand(pod)
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
            with self._lock:  # decide and assume under the lock; write outside it
                snapshot = self.state.snapshot()
                found = self.decider.fresh_plan(snapshot, demand, node)
                if isinstance(found, Unfit):
                    return f"node {node} can no longer take the pod: {found.reason}"
                used = self.state.namespace_usage(namespace, skip_uid=uid)
                reason = over_quota(snapshot.quotas_in(namespace), used, plan_amounts(found))
                if reason is not None:
                    return reason
                holds = tuple(PodHold(uid, c, namespace, g) for c, g in found.grants.items())
                self.state.assume(uid, node, holds)
            annotation = signed_assignment(node, uid, found.grants, self.key, self.clock())
            binding["metadata"]["annotations"] = {ANNOTATION_ASSIGNMENT: annotation}
        try:
            self.kube.create(pod_path + "/binding", binding)
        except KubeError:
            if holds:
                self.state.forget(uid)
            raise
        if holds:
            self.state.bound(uid)
        first = self.seen.bound(uid)
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
