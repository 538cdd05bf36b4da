"""The cluster as the extender sees it, for Prometheus: capacity and use per vendor and model,
device health, node heartbeats and ComputeQuota usage.

The extender already keeps every ComputeNode, heartbeat Lease and ComputeQuota in its
informers; this collector reads one snapshot of them per scrape, so a node or a device that
leaves the cluster leaves the next scrape with it. Every replica exports the same view (the
informers do not need the lease); rules take `max` over replicas.

Per-node and per-device series are bounded by what matters: heartbeats only for nodes that
have a ComputeNode (a removed node's Lease leaves no series behind), and per-device health
only for devices that are not healthy (the counts per model cover the healthy ones), so a
scrape of a large healthy cluster costs per model, not per device.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hcsd.cluster.compute_quota import Amounts, Quota
from hcsd.cluster.heartbeats import stale_reason
from hcsd.cluster.state import ClusterState
from hcsd.contract.names import QUOTA_DEVICES, QUOTA_TFLOPS, QUOTA_VRAM
from hcsd.profiles.exchange import share_tflops

__all__ = ["ClusterCollector"]

MODEL = ["vendor", "model"]
_RESOURCES = {QUOTA_VRAM: "vram_bytes", QUOTA_TFLOPS: "tflops_fp16", QUOTA_DEVICES: "devices"}


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class ClusterCollector(Collector):
    def __init__(
        self, state: ClusterState, acu_tflops: float, is_leader: Callable[[], bool]
    ) -> None:
        self.state = state
        self.acu_tflops = acu_tflops  # FP16 TFLOPS in one ACU (the profile database's)
        self.is_leader = is_leader

    def collect(self) -> Iterator[Metric]:
        snapshot = self.state.snapshot()
        nodes, pods = self.state.counts()
        yield GaugeMetricFamily("hcs_extender_compute_nodes", "ComputeNodes seen.", value=nodes)
        yield GaugeMetricFamily(
            "hcs_extender_assigned_pods", "Pods holding accelerators.", value=pods
        )
        yield GaugeMetricFamily(
            "hcs_extender_leader",
            "1 on the replica that binds (holds the lease).",
            value=1 if self.is_leader() else 0,
        )
        devices = _gauge("hcs_cluster_devices", "Devices, by health.", [*MODEL, "health"])
        vram = _gauge("hcs_cluster_vram_bytes", "Device memory in all.", MODEL)
        vram_used = _gauge(
            "hcs_cluster_vram_allocated_bytes", "Device memory granted to pods.", MODEL
        )
        acu = _gauge("hcs_cluster_acu", "Compute in ACU (FP16 TFLOPS / the ACU's).", MODEL)
        acu_used = _gauge("hcs_cluster_acu_allocated", "Compute reserved, in ACU.", MODEL)
        health = _gauge(
            "hcs_cluster_device_health",
            "1 for each device that is not healthy, labelled with its health as its "
            "ComputeNode reports it (healthy devices are counted in hcs_cluster_devices).",
            ["node", "device", *MODEL, "health"],
        )
        counts: Counter[tuple[str, str, str]] = Counter()
        sums: dict[tuple[str, str], list[float]] = {}
        for name, node in sorted(snapshot.nodes.items()):
            for d in node.view.devices:
                key = (d.vendor.value, d.model)
                state = d.health_state.value
                counts[(*key, state)] += 1
                if state != "healthy":
                    health.add_metric([name, d.uuid, *key, state], 1)
                use = node.usage.get(d.uuid)
                row = sums.setdefault(key, [0.0, 0.0, 0.0, 0.0])
                row[0] += d.vram_bytes
                row[1] += use.vram_bytes if use else 0
                row[2] += d.tflops_fp16 / self.acu_tflops
                if use:
                    row[3] += share_tflops(d.tflops_fp16, use.compute_percent) / self.acu_tflops
        for (vendor, model, state), n in sorted(counts.items()):
            devices.add_metric([vendor, model, state], n)
        for key, (total, used, acus, acus_used) in sorted(sums.items()):
            vram.add_metric(list(key), total)
            vram_used.add_metric(list(key), used)
            acu.add_metric(list(key), acus)
            acu_used.add_metric(list(key), acus_used)
        yield from (devices, vram, vram_used, acu, acu_used, health)
        age = _gauge(
            "hcs_cluster_node_heartbeat_age_seconds",
            "Since the node's hcs heartbeat Lease was last seen renewed (nodes with a "
            "ComputeNode only).",
            ["node"],
        )
        stale = _gauge(
            "hcs_cluster_node_heartbeat_stale",
            "1 while the extender places no pods on the node for want of a heartbeat (none, "
            "or older than its Lease's duration): the rule the filter applies.",
            ["node"],
        )
        now = time.monotonic()
        for name in sorted(snapshot.nodes):
            beat = snapshot.heartbeats.get(name)
            if beat is not None:
                age.add_metric([name], max(now - beat.renewed, 0.0))
            stale.add_metric([name], 0 if stale_reason(beat, now) is None else 1)
        yield from (age, stale)
        yield self._quotas(snapshot.quotas)

    def _quotas(self, quotas: tuple[Quota, ...]) -> Metric:
        family = _gauge(
            "hcs_cluster_quota",
            "ComputeQuota limits (type=hard) and usage (type=used), by resource "
            "(vram_bytes, tflops_fp16, devices), as kube-state-metrics exports ResourceQuota.",
            ["namespace", "quota", "resource", "type"],
        )
        used_by: dict[str, Amounts] = {}
        for quota in quotas:
            used = used_by.get(quota.namespace)
            if used is None:
                used = used_by[quota.namespace] = self.state.namespace_usage(quota.namespace)
            values = {QUOTA_VRAM: used.vram, QUOTA_TFLOPS: used.tflops, QUOTA_DEVICES: used.devices}
            for key, resource in _RESOURCES.items():
                labels = [quota.namespace, quota.name, resource]
                family.add_metric([*labels, "used"], values[key])
                if key in quota.hard:
                    family.add_metric([*labels, "hard"], quota.hard[key])
        return family
