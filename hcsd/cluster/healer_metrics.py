"""hcs-controller's Prometheus metrics: every isolation action, counted.

Its own `CollectorRegistry` (never the library's global one), so two controllers in one
process (the leader-election test) keep their counts apart. The alerts built on them are in
packaging/helm/hcs/files/prometheus-rules.yaml.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from hcsd.contract.names import REASON_DEVICE_DEGRADED, REASON_DEVICE_FAILED

__all__ = ["HealerMetrics"]


class HealerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.evictions = Counter(
            "hcs_controller_evictions",
            "Evictions of pods holding a failed (or, by policy, degraded) device, by result: "
            "evicted, blocked (a PodDisruptionBudget; retried), opted_out "
            "(hcs.io/eviction: never), dry_run (would have been evicted)",
            ["result", "reason"],
            registry=self.registry,
        )
        self.conditions = Counter(
            "hcs_controller_disruption_conditions",
            "DisruptionTarget conditions given our reason on pods evicted off a failed device",
            ["reason"],
            registry=self.registry,
        )
        self.taints = Counter(
            "hcs_controller_taints",
            "hcs.io/accelerator-unhealthy taints put on (taint) or taken off (untaint) Nodes",
            ["action"],
            registry=self.registry,
        )
        self.tainted = Gauge(
            "hcs_controller_tainted_nodes",
            "Nodes carrying hcs.io/accelerator-unhealthy (as this leader put or found it)",
            registry=self.registry,
        )
        self.blocked = Gauge(
            "hcs_controller_blocked_evictions",
            "Pods on failed devices whose eviction a PodDisruptionBudget holds back now",
            registry=self.registry,
        )
        self.slow = Gauge(
            "hcs_controller_slow_devices",
            "Measured devices below their model's fleet median by more than the margin",
            registry=self.registry,
        )
        self.throttled = Gauge(
            "hcs_controller_throttled_evictions",
            "Pods on failed devices whose eviction waits for the evictions-per-minute limit",
            registry=self.registry,
        )
        self.circuit_open = Gauge(
            "hcs_controller_circuit_open",
            "1 while more than the breaker's share of nodes or devices is bad cluster-wide: "
            "nothing is evicted nor tainted",
            registry=self.registry,
        )
        self.leader = Gauge(
            "hcs_controller_leader",
            "1 while this replica holds the controller's Lease and acts",
            registry=self.registry,
        )
        self.fleet_marks = Counter(
            "hcs_controller_fleet_marks",
            "Writes of a ComputeNode's status.fleet: slow devices marked (mark), or the last "
            "one recovered (clear)",
            ["action"],
            registry=self.registry,
        )
        self.errors = Counter(
            "hcs_controller_api_errors",
            "Requests to the API server that failed (retried), by action",
            ["action"],
            registry=self.registry,
        )
        # Every series at 0 from the start: an alert on increase() sees the first eviction
        # (a series born at 1 has no increase to show).
        reasons = (REASON_DEVICE_FAILED, REASON_DEVICE_DEGRADED)
        for result in ("evicted", "blocked", "opted_out", "dry_run"):
            for reason in reasons:
                self.evictions.labels(result, reason)
        for reason in reasons:
            self.conditions.labels(reason)
        for action in ("taint", "untaint"):
            self.taints.labels(action)
        for action in ("mark", "clear"):
            self.fleet_marks.labels(action)
        for action in ("evict", "condition", "event", "taint", "fleet"):
            self.errors.labels(action)

    def standby(self) -> None:
        """The leader's gauges at 0 on a replica that does not lead: summed across replicas,
        a standby's copy would count them twice."""
        for gauge in (self.leader, self.tainted, self.blocked, self.throttled, self.circuit_open,
                      self.slow):  # fmt: skip
            gauge.set(0)
