"""The node's metric families, read from the service's live state on every scrape.

A custom collector rather than gauges set as things change: nothing here keeps a copy of the
numbers, so a device that leaves the node leaves the next scrape with it (no stale label set),
and the labels are escaped by the library. Names and labels are a contract with the alerting
rules and the dashboard: docs/metrics.md lists every one, and a test holds the two equal.
"""

from __future__ import annotations

import calendar
import contextlib
import time
from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from hcsd import __version__
from hcsd.contract.names import SUBHEALTH_ATTRIBUTE, SUBHEALTH_NODE_ATTRIBUTE
from hcsd.health.watching import HealthWatcher
from hcsd.model import Device, HealthState
from hcsd.profiles import ProfileDatabase, default_database
from hcsd.refusals import Reason
from hcsd.service import NodeService
from hcsd.watchdog import Watchdog
from hcsd.watchdog.metric_families import families

__all__ = ["DEVICE_LABELS", "NodeCollector"]

DEVICE_LABELS = ["device", "vendor", "model", "index"]


def _device_labels(device: Device) -> list[str]:
    return [device.uuid, device.vendor.value, device.model, str(device.index)]


def _utc_seconds(text: str) -> float:
    """Unix time of `2023-11-14T22:13:20Z` (how `measured_at` is written)."""
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))


def _measured_families() -> list[tuple[GaugeMetricFamily, str, Callable[[str], float]]]:
    """The measured fingerprint's figures, from the device attributes hcsd.benchmarks sets:
    (family, attribute, conversion to the family's unit)."""
    return [
        (
            GaugeMetricFamily(
                "hcs_device_measured_fp16_tflops",
                "Dense FP16 TFLOPS measured on the node (a GEMM through the vendor's library).",
                labels=DEVICE_LABELS,
            ),
            "measured_tflops_fp16",
            float,
        ),
        (
            GaugeMetricFamily(
                "hcs_device_measured_ratio",
                "Measured FP16 TFLOPS over the profile's datasheet figure (a healthy card: "
                "about its model's gemm_efficiency, 0.7 by default).",
                labels=DEVICE_LABELS,
            ),
            "measured_ratio",
            float,
        ),
        (
            GaugeMetricFamily(
                "hcs_device_measured_memory_bandwidth_bytes_per_second",
                "Device memory bandwidth measured with a device-to-device copy (read + write).",
                labels=DEVICE_LABELS,
            ),
            "measured_bandwidth_gbps",
            lambda text: float(text) * 1e9,
        ),
        (
            GaugeMetricFamily(
                "hcs_device_measured_timestamp_seconds",
                "When the device's figures were measured (Unix time): their age.",
                labels=DEVICE_LABELS,
            ),
            "measured_at",
            _utc_seconds,
        ),
    ]


class NodeCollector(Collector):
    def __init__(
        self,
        service: NodeService,
        watcher: HealthWatcher | None = None,
        vram: Watchdog | None = None,
        profiles: ProfileDatabase | None = None,
    ) -> None:
        self.service = service
        self.watcher = watcher
        self.vram = vram
        self.profiles = profiles or default_database()

    def collect(self) -> Iterator[Metric]:
        yield from self._node()
        yield from self._devices()
        yield from self._health()
        if self.vram is not None:
            for family in families(self.vram):
                kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
                labels = [k for k, _ in family.samples[0][0]] if family.samples else []
                metric = kind(family.name, family.doc, labels=labels)
                for pairs, value in family.samples:
                    metric.add_metric([v for _, v in pairs], value)
                yield metric

    def _node(self) -> Iterator[Metric]:
        service = self.service
        info = InfoMetricFamily("hcs_build", "hcsd version and the node it serves.")
        info.add_metric([], {"version": __version__, "node": service.node_name})
        yield info
        yield GaugeMetricFamily(
            "hcs_allocations",
            "Containers holding device slices on this node.",
            value=len(service.allocations()),
        )
        yield GaugeMetricFamily(
            "hcs_orphaned_allocations",
            "Allocations on devices this node no longer has.",
            value=len(service.orphans()),
        )
        refusals = CounterMetricFamily(
            "hcs_refusals", "Requests refused, by reason.", labels=["reason"]
        )
        counts = {reason.value: 0 for reason in Reason} | {
            reason.value: n for reason, n in service.refusal_counts().items()
        }
        for reason, n in sorted(counts.items()):
            refusals.add_metric([reason], n)
        yield refusals
        yield CounterMetricFamily(
            "hcs_uninjected_containers",
            "Containers that asked for devices found running without hcsd's devices and quota.",
            value=service.uninjected_count,
        )
        yield GaugeMetricFamily(
            "hcs_ledger_seq", "Sequence number of the ledger's last record.", value=service.seq
        )
        yield GaugeMetricFamily(
            "hcs_watchers", "Clients watching the API.", value=service.watcher_count
        )

    def _devices(self) -> Iterator[Metric]:
        statuses = self.service.devices()
        capacity = GaugeMetricFamily(
            "hcs_device_vram_capacity_bytes", "Device memory of each device.", labels=DEVICE_LABELS
        )
        allocated = GaugeMetricFamily(
            "hcs_device_vram_allocated_bytes",
            "Device memory held by allocations.",
            labels=DEVICE_LABELS,
        )
        compute = GaugeMetricFamily(
            "hcs_device_compute_allocated_percent",
            "Compute share reserved by allocations.",
            labels=DEVICE_LABELS,
        )
        holders = GaugeMetricFamily(
            "hcs_device_allocations", "Allocations holding each device.", labels=DEVICE_LABELS
        )
        acu = GaugeMetricFamily(
            "hcs_device_acu",
            "Compute of the device in ACU, from its profile and, where taken, measured here.",
            labels=[*DEVICE_LABELS, "source"],
        )
        measured = _measured_families()
        for s in statuses:
            labels = _device_labels(s.device)
            attributes = dict(s.device.attributes)
            for family, key, convert in measured:
                if key in attributes:
                    with contextlib.suppress(ValueError):  # written by hcsd: never expected
                        family.add_metric(labels, convert(attributes[key]))
            capacity.add_metric(labels, s.device.vram_bytes)
            allocated.add_metric(labels, s.vram_allocated)
            compute.add_metric(labels, s.compute_allocated)
            holders.add_metric(labels, s.allocations)
            profile = self.profiles.lookup(s.device.vendor, s.device.model)
            if profile is not None and profile.figure("tflops_fp16") > 0:
                acu.add_metric([*labels, "profile"], self.profiles.acu(profile))
            if ("fingerprint", "measured") in s.device.attributes:
                acu.add_metric(
                    [*labels, "measured"], s.device.tflops_fp16 / self.profiles.acu_tflops
                )
        yield from (capacity, allocated, compute, holders, acu)
        yield from (family for family, _, _ in measured)

    def _health(self) -> Iterator[Metric]:
        statuses = self.service.devices()
        score = GaugeMetricFamily(
            "hcs_device_health_score", "Health score 0-100 (100 is healthy).", labels=DEVICE_LABELS
        )
        state = GaugeMetricFamily(
            "hcs_device_health_state",
            "1 for the device's current health state, 0 for the others.",
            labels=[*DEVICE_LABELS, "state"],
        )
        reason = GaugeMetricFamily(
            "hcs_device_health_reason",
            "1 for each device not healthy, with why: the kind of its last fault, in words "
            "that stay the same while the fault goes on (the details are in hcsd's log).",
            labels=["device", "reason"],
        )
        for s in statuses:
            labels = _device_labels(s.device)
            score.add_metric(labels, s.device.health_score)
            for each in HealthState:
                state.add_metric([*labels, each.value], 1 if s.device.health_state is each else 0)
            if s.device.health_state is not HealthState.HEALTHY:
                # the device's own (health.watching sets it with the ComputeNode's reason)
                why = dict(s.device.attributes).get("health_cause")
                reason.add_metric([s.device.uuid, why or s.device.health_state.value], 1)
        subhealth = GaugeMetricFamily(
            "hcs_device_subhealth",
            "1 for each named sub-health signal holding a device degraded (hw-slowdown, "
            "pcie-link-width, ecc-correctable-rising, below-profile-tflops, ...).",
            labels=["device", "reason"],
        )
        node_wide: set[str] = set()
        for s in statuses:
            attributes = dict(s.device.attributes)
            for name in filter(None, attributes.get(SUBHEALTH_ATTRIBUTE, "").split(",")):
                subhealth.add_metric([s.device.uuid, name], 1)
            node_wide.update(filter(None, attributes.get(SUBHEALTH_NODE_ATTRIBUTE, "").split(",")))
        node = GaugeMetricFamily(
            "hcs_node_subhealth",
            "1 for each clock reason every device of the node holds (hw-power-brake, "
            "sw-thermal-slowdown, ...): node-wide, no device degraded for it.",
            labels=["reason"],
        )
        for name in sorted(node_wide):
            node.add_metric([name], 1)
        yield from (score, state, reason, subhealth, node)
        bad = {s.device.uuid for s in statuses if not s.device.health_state.schedulable}
        on_bad = sum(1 for a in self.service.allocations() if bad.intersection(a.device_uuids))
        yield GaugeMetricFamily(
            "hcs_allocations_on_unschedulable_devices",
            "Containers holding an unhealthy or lost device (the cluster side should act).",
            value=on_bad,
        )
        source = GaugeMetricFamily(
            "hcs_health_source", "1 for the active health event source.", labels=["source"]
        )
        source.add_metric([self.service.health_source], 1)
        yield source
        if self.watcher is not None:
            events = CounterMetricFamily(
                "hcs_health_events",
                "Kernel health events by vendor, code and severity.",
                labels=["vendor", "code", "severity"],
            )
            for (v, c, sev), n in sorted(self.watcher.events.items()):
                events.add_metric([v, c, sev], n)
            lines = CounterMetricFamily(
                "hcs_health_source_lines",
                "Kernel lines seen, matched and dropped by the health source.",
                labels=["stage"],
            )
            for k, n in sorted(self.watcher.stats().items()):
                lines.add_metric([k], n)
            yield from (events, lines)
