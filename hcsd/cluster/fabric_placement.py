"""Keeping the pods of one job on one fabric domain: a filter rule and a prioritize rule.

The job's domain is the fabric domain (ComputeNode spec.fabric.domain) where most of its pods
hold accelerators now (`JobIndex`); before any of them does, the domain chosen for its first
pod: among the nodes kube-scheduler offers, the domain with the most room for pods like this
one (`room`), so that the whole job fits there if any domain can take it. That choice is
remembered for `CHOICE_SECONDS`, long enough for the first pods' Bindings to show in the pods
informer, so pods decided in between do not each pick a domain of their own.

- **prioritize** (every pod of a job, when some node reports a domain): a node in the job's
  domain scores 6..10 (6 + 4/10 of its node score), any other node 0..5 (half its node score).
  Inside each band the node's own score (how well its devices fit) still orders the nodes.
- **filter** (only with `hcs.io/topology-preference: high-bandwidth`): once the job has a
  domain, nodes outside it fail with a reason naming both domains, so a job whose domain is
  full waits there instead of spilling onto another fabric.

Which devices a pod gets inside its node is not touched: that is the planner's choice.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hcsd.cluster.demand import Demand
from hcsd.cluster.fabric_jobs import JobIndex, JobKey, job_of
from hcsd.cluster.state import NodeSnapshot, Snapshot
from hcsd.contract.names import ANNOTATION_TOPOLOGY
from hcsd.model import TopologyPreference

__all__ = ["CHOICE_SECONDS", "FabricPlacement", "lift", "room"]

CHOICE_SECONDS = 30.0
_CHOICES = 10_000  # first-pod choices remembered at most (expired ones are dropped first)
_ROOMS = 50_000  # room() answers kept


def room(demand: Demand, node: NodeSnapshot) -> int:
    """About how many more pods like `demand` fit on the node: its schedulable devices of the
    vendors and models asked, as slices of the VRAM asked per device (whole free devices when
    no VRAM is asked), over the devices one pod takes. An estimate for choosing a domain,
    not a plan."""
    per_device = max((c.vram_bytes or 0) for c in demand.containers)
    per_pod = sum(c.devices for c in demand.containers) or 1
    slots = 0
    for device in node.view.devices:
        if not device.health_state.schedulable:
            continue
        if demand.vendors and device.vendor not in demand.vendors:
            continue
        if demand.models and device.model.lower() not in demand.models:
            continue
        used = node.usage.get(device.uuid)
        if per_device:
            slots += max(device.vram_bytes - (used.vram_bytes if used else 0), 0) // per_device
        elif used is None or (used.vram_bytes == 0 and used.compute_percent == 0):
            slots += 1
    return slots // per_pod


def lift(score: int, in_domain: bool) -> int:
    """A node's 0..10 score with the job's fabric domain first: 6..10 inside, 0..5 outside."""
    return 6 + score * 4 // 10 if in_domain else score * 5 // 10


class FabricPlacement:
    def __init__(self, jobs: JobIndex, clock: Callable[[], float] = time.monotonic) -> None:
        self.jobs = jobs
        self.clock = clock
        self._lock = threading.Lock()
        self._chosen: dict[JobKey, tuple[str, float]] = {}  # job -> (domain, until)
        # room() by (node shape id, demand): a pure function of both, so equal nodes (most of
        # a fleet) are counted once; racing threads can only store the same value twice.
        self._rooms: dict[tuple[int, Demand], int] = {}

    def domain_of(self, job: JobKey, snapshot: Snapshot) -> str:
        """Where most of the job's pods hold accelerators (ties: the first name), else the
        domain chosen for its first pods while that choice holds, else ""."""
        counts: Counter[str] = Counter()
        for name, pods in self.jobs.nodes_of(job).items():
            node = snapshot.nodes.get(name)
            if node is not None and node.view.fabric:
                counts[node.view.fabric] += pods
        if counts:
            return min(counts, key=lambda domain: (-counts[domain], domain))
        with self._lock:
            chosen = self._chosen.get(job)
        if chosen is not None and chosen[1] > self.clock():
            return chosen[0]
        return ""

    def filter(
        self,
        pod: Mapping[str, Any],
        demand: Demand,
        snapshot: Snapshot,
        passed: Sequence[str],
        failed: Mapping[str, str],
    ) -> tuple[list[str], Mapping[str, str]]:
        """`passed` less the nodes outside the job's domain, which join `failed` with why,
        when the pod asks for high bandwidth; else both as they are."""
        if demand.topology is not TopologyPreference.HIGH_BANDWIDTH:
            return list(passed), failed
        job = job_of(pod)
        domain = self.domain_of(job, snapshot) if job is not None else ""
        if not domain:
            return list(passed), failed
        keep: list[str] = []
        refused = dict(failed)
        for name in passed:
            node = snapshot.nodes.get(name)
            here = node.view.fabric if node is not None else ""
            if here == domain:
                keep.append(name)
            else:
                where = f"is in fabric domain {here}" if here else "reports no fabric domain"
                refused[name] = (
                    f"node {where}; the pods of {job} run in fabric domain {domain} "
                    f"({ANNOTATION_TOPOLOGY}: high-bandwidth keeps a job on one fabric)"
                )
        return keep, refused

    def prioritize(
        self,
        pod: Mapping[str, Any],
        demand: Demand,
        snapshot: Snapshot,
        scores: Sequence[tuple[str, int]],
    ) -> list[tuple[str, int]]:
        """`scores` with the job's fabric domain first (`lift`); as they are for a pod of no
        job, or when no node offered reports a domain."""
        job = job_of(pod)
        if job is None:
            return list(scores)
        fabric = {}
        for name, _ in scores:
            node = snapshot.nodes.get(name)
            if node is not None and node.view.fabric:
                fabric[name] = node.view.fabric
        if not fabric:
            return list(scores)
        domain = self.domain_of(job, snapshot) or self._choose(job, demand, snapshot, fabric)
        return [(name, lift(score, fabric.get(name) == domain)) for name, score in scores]

    def _choose(
        self, job: JobKey, demand: Demand, snapshot: Snapshot, fabric: Mapping[str, str]
    ) -> str:
        """The domain with the most room for the job's pods (then the most nodes offered,
        then the first name), remembered for its next pods."""
        rooms: Counter[str] = Counter()
        nodes: Counter[str] = Counter()
        if len(self._rooms) > _ROOMS:
            self._rooms = {}
        for name, domain in fabric.items():
            node = snapshot.nodes[name]
            found = self._rooms.get((node.shape_id, demand))
            if found is None:
                found = self._rooms[(node.shape_id, demand)] = room(demand, node)
            rooms[domain] += found
            nodes[domain] += 1
        domain = min(nodes, key=lambda d: (-rooms[d], -nodes[d], d))
        now = self.clock()
        with self._lock:
            if len(self._chosen) >= _CHOICES:
                self._chosen = {k: v for k, v in self._chosen.items() if v[1] > now}
                if len(self._chosen) >= _CHOICES:
                    self._chosen.clear()
            self._chosen[job] = (domain, now + CHOICE_SECONDS)
        return domain
