"""Bind: re-plan the pod on the node kube-scheduler chose, assume it, sign, post the Binding.

Binds are serialised (`Binder._lock`): each one re-plans against the latest state, which
includes the binds before it, so two pods racing for the last slice cannot both get it; the
loser's bind fails and kube-scheduler tries the pod again, where the filter now says why not.
The grants are assumed before the Binding is written (and forgotten if the write fails), so
no decision in between can hand them out again.

The API server copies a Binding's annotations onto the pod in the same write, so a pod is
never bound without its assignment, nor annotated for a node it did not get. A pod naming a
RuntimeProfile gets its containers' images set by one patch just before (`rebinding.py`: a
Binding carries annotations only), and its assignment records the resolved profile.

What is signed comes from the API server, never from a caller: bind reads the pod as the
extender's watch of pods shows it (`pending.pending_copy`; a GET when the watch keeps no copy
of it), checks that it is the one kube-scheduler named (its uid), that it is not bound yet
and that it is scheduled by a scheduler this extender serves (`spec.schedulerName`), and
computes the demand from that object. The Binding names the uid and the resourceVersion of
the pod read, which the API server checks as preconditions: it binds neither another pod of
the name nor a pod written since (its `hcs.io/*` hints may have changed). A copy out of
date costs one 409, then one GET and one more try in the same call. The pod body a /filter
call carried is only ever used to decide filter answers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from hcsd.cluster.decisions import Decider, over_quota, plan_amounts
from hcsd.cluster.demand import Demand, DemandError
from hcsd.cluster.extender_metrics import Metrics
from hcsd.cluster.fabric_jobs import JobKey, job_of
from hcsd.cluster.kube import Kube, KubeError, paths_for
from hcsd.cluster.objects import PodHold
from hcsd.cluster.pending import DEFAULT_SCHEDULERS, scheduler_of
from hcsd.cluster.planner import Unfit
from hcsd.cluster.rebinding import Rebinder
from hcsd.cluster.state import ClusterState
from hcsd.contract import assignment
from hcsd.contract.keyring import Keyring, node_key
from hcsd.contract.names import ANNOTATION_ASSIGNMENT
from hcsd.contract.runtime_binding import ResolvedRuntime
from hcsd.model import Grant

__all__ = [
    "DEFAULT_SCHEDULERS",
    "UNSETTLED_SECONDS",
    "BindRequest",
    "Binder",
    "SeenPods",
    "signed_assignment",
]

log = logging.getLogger(__name__)

_SEEN = 10_000
# A Binding of unknown outcome keeps its reservation this long unless the watch shows the pod
# bound first (it does within a second when the write was done).
UNSETTLED_SECONDS = 30.0


def unknown_outcome(error: KubeError) -> bool:
    """Whether a write that failed with `error` may have been done all the same: no answer
    (a timeout, a broken connection) or the API server's own timeout (504)."""
    return error.status in (0, 504)


@dataclass(frozen=True, slots=True)
class BindRequest:
    namespace: str
    name: str
    uid: str
    node: str


def signed_assignment(
    node: str,
    pod_uid: str,
    grants: Mapping[str, tuple[Grant, ...]],
    keys: Keyring,
    issued: float,
    *,
    runtime: Mapping[str, ResolvedRuntime] | None = None,
) -> str:
    """The `hcs.io/assignment` annotation: what each container got (and, for a pod with a
    RuntimeProfile, what it runs: version 3), signed for hcsd with the node's own key derived
    from the cluster's signing key, and naming that key's id."""
    key = node_key(keys.signing_key, node)
    body = assignment.Assignment(
        node, pod_uid, issued, grants, keys.signing, runtime=MappingProxyType(dict(runtime or {}))
    )
    return assignment.encode(body, key)


class SeenPods:
    """When each pod was first filtered, by uid (for the scheduling latency metric). Bounded.
    Only times: what a pod asks for is read from the API server at bind."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _first; held for a dict operation
        self._first: OrderedDict[str, float] = OrderedDict()

    def remember(self, uid: str) -> None:
        with self._lock:
            if uid not in self._first:
                self._first[uid] = time.monotonic()
                if len(self._first) > _SEEN:
                    self._first.popitem(last=False)

    def bound(self, uid: str) -> float | None:
        """Forget the pod; when it was first filtered (monotonic), if known."""
        with self._lock:
            return self._first.pop(uid, None)


def refusal(pod: Mapping[str, Any], request: BindRequest, schedulers: frozenset[str]) -> str:
    """Why the pod the API server holds may not be bound as `request` asks, or ""."""
    meta = pod.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    if uid != request.uid:
        return f"pod {request.namespace}/{request.name} has uid {uid}, not {request.uid}"
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    if node:
        return f"pod {request.namespace}/{request.name} is already bound to {node}"
    scheduler = scheduler_of(pod)
    if scheduler not in schedulers:
        return (
            f"pod {request.namespace}/{request.name} is scheduled by {scheduler!r}, "
            f"which this extender does not serve ({', '.join(sorted(schedulers))})"
        )
    return ""


class Binder:
    def __init__(
        self,
        kube: Kube,
        keys: Callable[[], Keyring],
        state: ClusterState,
        decider: Decider,
        metrics: Metrics,
        *,
        is_leader: Callable[[], bool],
        clock: Callable[[], float] = time.time,
        schedulers: frozenset[str] = DEFAULT_SCHEDULERS,
    ) -> None:
        self.kube = kube
        self.schedulers = schedulers
        self.keys = keys  # the cluster keyring, as the Secret holds it now
        self.state = state
        self.decider = decider
        self.metrics = metrics
        self.is_leader = is_leader
        self.clock = clock
        self.seen = SeenPods()
        self.rebinder = Rebinder(kube, decider)
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
        self.metrics.bound(not error)
        if error:
            log.warning(
                "bind %s/%s to %s: %s", request.namespace, request.name, request.node, error
            )
        return error

    def _watched(self, request: BindRequest) -> Mapping[str, Any] | None:
        """The pod as the extender's watch of pods last showed it, unbound and with the uid
        kube-scheduler named; None (then bind GETs it) when the watch has not shown it yet,
        shows it bound or another pod of that name, or keeps no copy of it. What bind reads
        of it cannot change on an unbound pod but its `hcs.io/*` hints (the uid,
        `spec.schedulerName` and extended resources are immutable; an in-place resize changes
        cpu and memory only): the Binding's resourceVersion precondition catches those."""
        info = self.state.pods.get(f"{request.namespace}/{request.name}")
        if info is None or info.pending is None or info.uid != request.uid:
            return None
        self.metrics.bind_source.labels("watch").inc()
        return info.pending

    def _bind(self, request: BindRequest) -> str:
        if not self.is_leader():
            return "this hcs-scheduler-extender replica is not the leader"
        pod = self._watched(request)  # the API server's word, never the caller's
        if pod is not None:
            try:
                return self._attempt(request, pod)
            except KubeError as e:
                if not e.conflict:
                    raise
                # The copy is out of date (the pod was written since: the requeue's touch, a
                # hint changed) or another pod has its name: decide once more on the pod as it is.
                log.info("bind %s/%s: %s; reading the pod", request.namespace, request.name, e)
                return self._attempt(request, self._read(request, "conflict"))
        return self._attempt(request, self._read(request, "get"))

    def _read(self, request: BindRequest, source: str) -> Mapping[str, Any]:
        """GET the pod; `source` says why, for the metric: "get" (no copy of it in the
        watch), "conflict" (the API server refused a Binding made from the copy)."""
        self.metrics.bind_source.labels(source).inc()
        return self.kube.get(paths_for("v1", "pods", request.namespace, request.name))

    def _attempt(self, request: BindRequest, pod: Mapping[str, Any]) -> str:
        """Bind the pod as `pod` (read from the API server) shows it; "" or why not."""
        refused = refusal(pod, request, self.schedulers)
        if refused:
            return refused
        try:
            demand = self.decider.demand(pod)
        except DemandError as e:
            return str(e)
        namespace, name, node, uid = request.namespace, request.name, request.node, request.uid
        # The API server binds only the pod of this uid at this version (preconditions): never
        # a pod whose hints changed since it was read, nor another of its name.
        version = (pod.get("metadata") or {}).get("resourceVersion")
        binding: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid}
            | ({"resourceVersion": str(version)} if version else {}),
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        if demand is None:
            self._write(request, binding)
            return self._done(request, ())
        reserved = self._reserve(request, demand, job_of(pod))
        if isinstance(reserved, str):
            return reserved
        grants, token, runtime = reserved
        holds = tuple(PodHold(uid, c, namespace, g) for c, g in grants.items())
        try:
            if runtime:  # the images first (a Binding carries annotations only), at the
                # version read; the Binding then names the version this patch made
                binding["metadata"]["resourceVersion"] = self.rebinder.set_images(pod, runtime)
        except BaseException:  # the pod is not bound: nothing is held
            self.state.forget(uid, token)
            raise
        try:
            annotation = signed_assignment(
                node, uid, grants, self.keys(), self.clock(), runtime=runtime
            )
            binding["metadata"]["annotations"] = {ANNOTATION_ASSIGNMENT: annotation}
            self._write(request, binding)
        except KubeError as e:
            if not unknown_outcome(e):
                self.state.forget(uid, token)
                raise
            # Written or not: the pod may hold the grants. The watch settles it.
            self.state.unsettled(uid, token, UNSETTLED_SECONDS)
            return (
                f"bind failed: {e}; the outcome is unknown: the grants stay reserved until the "
                f"watch shows the pod bound, or for {UNSETTLED_SECONDS:.0f} s"
            )
        except BaseException:  # whatever breaks between assume and write: nothing is held
            self.state.forget(uid, token)
            raise
        self.state.bound(uid, token)
        return self._done(request, holds)

    def _reserve(
        self, request: BindRequest, demand: Demand, job: JobKey | None
    ) -> tuple[Mapping[str, tuple[Grant, ...]], int, Mapping[str, ResolvedRuntime]] | str:
        """Decide the pod's grants on the node against the latest state and assume them (with
        where its `job`'s pod goes), under the lock: (the grants, the reservation's token,
        each container's runtime when the pod names a RuntimeProfile), or why not."""
        namespace, node, uid = request.namespace, request.node, request.uid
        with self._lock:
            snapshot = self.state.snapshot()
            found = self.decider.fresh_plan(snapshot, demand, node)
            if isinstance(found, Unfit):
                return f"node {node} can no longer take the pod: {found.reason}"
            quotas = snapshot.quotas_in(namespace)
            if quotas:  # the namespace's usage: a walk over its pods, only when it counts
                used = self.state.namespace_usage(namespace, skip_uid=uid)
                reason = over_quota(quotas, used, plan_amounts(found))
                if reason is not None:
                    return reason
            runtime: Mapping[str, ResolvedRuntime] = {}
            if demand.cover is not None:
                devices = snapshot.nodes[node].view.devices
                resolved = self.rebinder.resolve(demand.cover.profile, found.grants, devices)
                if isinstance(resolved, str):
                    return resolved
                runtime = resolved
                # hcsd refuses a larger annotation on every container create: refuse it here,
                # before an image is changed, rather than bind a pod that can never start.
                size = len(signed_assignment(
                    node, uid, found.grants, self.keys(), self.clock(), runtime=runtime
                ))  # fmt: skip
                if size > assignment.MAX_BYTES:
                    return (
                        f"RuntimeProfile {demand.cover.profile}: the resolved profile makes the "
                        f"{ANNOTATION_ASSIGNMENT} annotation {size} bytes, over the "
                        f"{assignment.MAX_BYTES} hcsd accepts: shorten its env, command or args"
                    )
            holds = tuple(PodHold(uid, c, namespace, g) for c, g in found.grants.items())
            token = self.state.assume(uid, node, holds, job)
        if token is None:
            return (
                f"pod {namespace}/{request.name} holds grants already: it is bound, or another "
                "bind of it is in flight or not settled yet"
            )
        return found.grants, token, runtime

    def _write(self, request: BindRequest, binding: Mapping[str, Any]) -> None:
        path = paths_for("v1", "pods", request.namespace, request.name) + "/binding"
        self.kube.create(path, binding)

    def _done(self, request: BindRequest, holds: tuple[PodHold, ...]) -> str:
        """The Binding is written: the metrics and the log line."""
        self.metrics.pending.bound(request.uid)
        first = self.seen.bound(request.uid)
        if first is not None:
            self.metrics.scheduling.observe(time.monotonic() - first)
        log.info(
            "bound %s/%s to %s%s",
            request.namespace,
            request.name,
            request.node,
            f" ({sum(len(h.grants) for h in holds)} grant(s))" if holds else "",
        )
        return ""
