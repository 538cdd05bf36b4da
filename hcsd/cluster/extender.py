"""hcs-scheduler-extender's parts, put together: kube-scheduler's three verbs and the metrics.

- `state.ClusterState`: informers, heartbeats, the assume cache; one lock.
- `decisions.Decider`: filter and prioritize over immutable snapshots of that state.
- `binding.Binder`: re-plan, assume, sign, post the Binding.
- `quota_status.QuotaStatusWriter`: ComputeQuota `status.used`.
- `requeue.Requeuer`: touches the pods filter refused once they fit (docs/cluster.md, Requeue).
- `http`: kube-scheduler's wire format, which nothing here sees.

Filter and prioritize never write to the API server (the requeue worker does, on its own
thread). Each verb is timed into
`hcs_extender_request_seconds{verb}`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import PlatformCollector, ProcessCollector, generate_latest

from hcsd.cluster.binding import DEFAULT_SCHEDULERS, Binder, BindRequest
from hcsd.cluster.cluster_metrics import ClusterCollector
from hcsd.cluster.decisions import NOTHING, Decider
from hcsd.cluster.demand import Demand, DemandError
from hcsd.cluster.extender_metrics import Metrics
from hcsd.cluster.fabric_placement import FabricPlacement
from hcsd.cluster.kube import Kube
from hcsd.cluster.quota_status import QuotaStatusWriter
from hcsd.cluster.requeue import Requeuer
from hcsd.cluster.requeue_guard import RequeueGuard
from hcsd.cluster.state import ClusterState, Snapshot
from hcsd.contract.keyring import Keyring
from hcsd.contract.names import NAMESPACE
from hcsd.profiles.database import ProfileDatabase

__all__ = ["Extender", "FilterAnswer"]


@dataclass(frozen=True, slots=True)
class FilterAnswer:
    passed: Sequence[str]
    failed: Mapping[str, str]  # node -> why not, verbatim in the pod's condition
    # node -> why not, where preempting pods there would not help (fabric placement)
    unresolvable: Mapping[str, str] = field(default_factory=dict)


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid", ""))


class Extender:
    def __init__(
        self,
        kube: Kube,
        keys: Callable[[], Keyring],
        db: ProfileDatabase,
        *,
        namespace: str = NAMESPACE,
        is_leader: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.time,
        schedulers: frozenset[str] = DEFAULT_SCHEDULERS,
        requeue: bool = True,
        own_pod: tuple[str, str] | None = None,
        claims: bool = False,
        runtime_profiles: bool = True,
    ) -> None:
        self.is_leader = is_leader
        self.keys = keys
        self.metrics = Metrics(is_leader)
        self.state = ClusterState(
            kube, keys=keys, namespace=namespace, clock=clock, schedulers=schedulers,
            claims=claims, profiles=runtime_profiles,
        )  # fmt: skip
        self.metrics.pending_copies.set_function(lambda: len(self.state.copies))
        self.decider = Decider(
            db, self.metrics, self.state.changed_between,
            profiles=self.state.runtime_profile, profiles_listed=self.state.profiles.synced.is_set,
            profiles_on=runtime_profiles,
        )  # fmt: skip
        self.binder = Binder(
            kube, keys, self.state, self.decider, self.metrics,
            is_leader=is_leader, clock=clock, schedulers=schedulers,
        )  # fmt: skip
        self.quota_status = QuotaStatusWriter(kube, self.state)
        self.fabric = FabricPlacement(self.state.jobs, self.state.changed_between)
        registry = self.metrics.registry
        # requeue=False (the chart's requeue.enabled): no `patch pods` granted, nothing touched.
        self.requeue_enabled = requeue
        self.requeue = Requeuer(
            kube, self.state, self.decider, lambda: self.keys().signing, registry,
            is_leader=is_leader, guard=RequeueGuard(kube, registry, own=own_pod),
        )  # fmt: skip
        registry.register(ClusterCollector(self.state, db.acu_tflops, is_leader))
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)

    def start(self) -> Extender:
        self.state.start()
        if self.requeue_enabled:
            self.requeue.start()
        return self

    def stop(self) -> None:
        self.requeue.stop()
        self.state.stop()

    def filter(self, pod: Mapping[str, Any], names: Sequence[str]) -> FilterAnswer:
        started = time.perf_counter()
        try:
            return self._filter(pod, names)
        finally:
            self.metrics.observe("filter", time.perf_counter() - started)

    def _filter(self, pod: Mapping[str, Any], names: Sequence[str]) -> FilterAnswer:
        uid = _uid(pod)
        self.binder.seen.remember(uid)
        try:
            demand = self.decider.demand(pod)
        except DemandError as e:
            self.metrics.refuse("bad_request", len(names))
            return FilterAnswer([], {n: str(e) for n in names})
        if demand is None:
            return FilterAnswer(list(names), {})
        snapshot = self.state.snapshot()
        quotas = snapshot.quotas_in(demand.namespace)
        used = self.state.namespace_usage(demand.namespace, skip_uid=uid) if quotas else NOTHING
        verdict = self.decider.filter(
            snapshot, uid, demand, names, quotas=quotas, used=used, signing=self.keys().signing
        )
        passed, refused = self.fabric.filter(pod, demand, snapshot, list(verdict.scores))
        if refused:
            self.metrics.refuse("fabric", len(refused))
        self.metrics.pending.filtered(uid, demand.namespace, bool(passed))
        # Capacity refusals only: what the fabric rule refuses moves with the job's pods,
        # which kube-scheduler watches itself.
        if self.requeue_enabled:
            passed_any = bool(verdict.scores)
            self.requeue.filtered(pod, demand, names, passed_any, quotas=quotas, used=used)
        return FilterAnswer(passed, verdict.failed, refused)

    def prioritize(self, pod: Mapping[str, Any], names: Sequence[str]) -> list[tuple[str, int]]:
        started = time.perf_counter()
        try:
            demand: Demand | None
            try:
                demand = self.decider.demand(pod)
            except DemandError:
                demand = None
            taken: list[Snapshot] = []

            def snapshot() -> Snapshot:  # one snapshot for both rules, taken when needed
                if not taken:
                    taken.append(self.state.snapshot())
                return taken[0]

            scores = self.decider.prioritize(_uid(pod), demand, names, snapshot)
            if demand is None:
                return scores
            return self.fabric.prioritize(pod, demand, snapshot, scores)
        finally:
            self.metrics.observe("prioritize", time.perf_counter() - started)

    def bind(self, request: BindRequest) -> str:
        return self.binder.bind(request)

    def metrics_text(self) -> str:
        """The metrics in the classic text format (tests, and anyone curious)."""
        return generate_latest(self.metrics.registry).decode()
