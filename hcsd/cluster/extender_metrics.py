"""The extender's own Prometheus metrics: calls, latency histograms, refusals, binds, pending pods.

One `CollectorRegistry` per extender (never the library's global one), so two extenders in one
process (tests) keep their counts apart; the HTTP side renders it with `prometheus_client`,
in OpenMetrics when the scraper asks for it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["BUCKETS", "SCHEDULING_BUCKETS", "Metrics", "Pending"]

BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# A pod's first filter to its Binding: a fit is bound in a second, a pod waiting for room
# (quota, a device freed by another job) waits minutes to hours; past 3 hours all look alike.
SCHEDULING_BUCKETS = (
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0,
    7200.0, 10800.0,
)  # fmt: skip
# kube-scheduler retries an unschedulable pod at least every 5 minutes: a pod not filtered
# again for longer is gone (deleted, or scheduled by someone else) and is no longer counted.
PENDING_WINDOW = 360.0
_PENDING = 50_000  # pods remembered at most


class Pending(Collector):
    """Pods asking for accelerators that the extender has filtered and not yet bound.

    Exported only while this replica leads: kube-scheduler calls the ready (leading) replica
    alone, so a replica that has lost the lease holds a memory of pods that the new leader
    counts too, and summing both would count them twice for up to the window.
    """

    def __init__(self, is_leader: Callable[[], bool] = lambda: True) -> None:
        self.is_leader = is_leader
        self._lock = threading.Lock()
        self._pods: OrderedDict[str, tuple[str, bool, float]] = OrderedDict()  # uid -> ns, fit

    def filtered(self, uid: str, namespace: str, fits: bool) -> None:
        with self._lock:
            self._pods.pop(uid, None)
            self._pods[uid] = (namespace, fits, time.monotonic())
            if len(self._pods) > _PENDING:
                self._pods.popitem(last=False)

    def bound(self, uid: str) -> None:
        with self._lock:
            self._pods.pop(uid, None)

    def counts(self) -> dict[tuple[str, str], int]:
        """(namespace, "unschedulable" | "binding") -> pods, over the window."""
        horizon = time.monotonic() - PENDING_WINDOW
        found: dict[tuple[str, str], int] = {}
        with self._lock:
            while self._pods and next(iter(self._pods.values()))[2] < horizon:
                self._pods.popitem(last=False)
            for namespace, fits, _ in self._pods.values():
                key = (namespace, "binding" if fits else "unschedulable")
                found[key] = found.get(key, 0) + 1
        return found

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "hcs_extender_pending_pods",
            "Pods asking for accelerators, filtered in the last 6 minutes and not bound: "
            "no node fits them (unschedulable) or a node does and the bind is to come.",
            labels=["namespace", "phase"],
        )
        if not self.is_leader():
            yield family
            return
        for (namespace, phase), n in sorted(self.counts().items()):
            family.add_metric([namespace, phase], n)
        yield family


class Metrics:
    def __init__(self, is_leader: Callable[[], bool] = lambda: True) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "hcs_extender_requests", "Extender calls by verb.", ["verb"], registry=self.registry
        )
        self.errors = Counter(
            "hcs_extender_errors",
            "Extender calls that failed (an answer of 500, or a bind not done), by verb.",
            ["verb"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "hcs_extender_request_seconds",
            "Time to answer one call, by verb.",
            ["verb"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.scheduling = Histogram(
            "hcs_extender_scheduling_seconds",
            "From a pod's first filter call to its Binding.",
            buckets=SCHEDULING_BUCKETS,
            registry=self.registry,
        )
        self.refusals = Counter(
            "hcs_extender_refusals",
            "Nodes refused for a pod, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.binds = Counter(
            "hcs_extender_binds", "Binds by result.", ["result"], registry=self.registry
        )
        self.bind_source = Counter(
            "hcs_extender_bind_pod_reads",
            "Where bind read the pod from: the extender's watch of pods (watch), a GET when the "
            "watch kept no copy of it (get), or a GET after the API server refused a Binding "
            "made from the copy as out of date (conflict).",
            ["source"],
            registry=self.registry,
        )
        self.pending_copies = Gauge(
            "hcs_extender_pending_pod_copies",
            "Unbound pods the extender's watch keeps a copy of for bind (capped: past the cap, "
            "bind GETs the pod).",
            registry=self.registry,
        )
        for source in ("watch", "get", "conflict"):
            self.bind_source.labels(source)
        for verb in ("filter", "prioritize", "bind"):
            self.requests.labels(verb)
            self.errors.labels(verb)
            self.latency.labels(verb)
        for result in ("ok", "error"):
            self.binds.labels(result)
        for reason in ("bad_request", "quota", "unfit"):
            self.refusals.labels(reason)
        self.pending = Pending(is_leader)
        self.registry.register(self.pending)

    def value(self, name: str, **labels: str) -> float | None:
        """One sample's value now, None when there is no such sample (a wrong name or label
        reads as None, never as a plausible 0): for tests and the command line."""
        return self.registry.get_sample_value(name, labels)

    def observe(self, verb: str, seconds: float) -> None:
        self.requests.labels(verb).inc()
        self.latency.labels(verb).observe(seconds)

    def refuse(self, reason: str, nodes: int) -> None:
        self.refusals.labels(reason).inc(nodes)

    def bound(self, ok: bool) -> None:
        self.binds.labels("ok" if ok else "error").inc()
        if not ok:
            self.errors.labels("bind").inc()
