"""Which job a pod belongs to, and on which nodes that job's pods hold accelerators.

A pod's job is named by, in this order: `hcs.io/job` (annotation, then label), the PodGroup
labels of coscheduling, JobSet's, Kubeflow training jobs', then Job's (`names.JOB_LABELS`);
always within the pod's namespace, and with the kind of job that named it, so that a JobSet
and a Job of one name in one namespace are two jobs.

`JobIndex` is fed by the extender's pods informer (bound pods holding a signed assignment,
`holds.pod_info`): job -> node -> pods. It has its own lock, held for one dict operation at a
time, and calls nothing while it holds it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hcsd.contract.names import JOB, JOB_LABELS

__all__ = ["JobIndex", "JobKey", "job_of"]


@dataclass(frozen=True, slots=True)
class JobKey:
    namespace: str
    kind: str  # "hcs" (hcs.io/job), podgroup, jobset, kubeflow, job
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def job_of(pod: Mapping[str, Any]) -> JobKey | None:
    """The pod's job, or None when nothing names one (a lone pod)."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    for source in (annotations, labels):
        name = source.get(JOB)
        if isinstance(name, str) and name:
            return JobKey(namespace, "hcs", name)
    for label, kind in JOB_LABELS:
        name = labels.get(label)
        if isinstance(name, str) and name:
            return JobKey(namespace, kind, name)
    return None


class JobIndex:
    """Job -> node -> how many of its pods hold accelerators there."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, tuple[JobKey, str]] = {}  # uid -> (job, node)
        self._nodes: dict[JobKey, Counter[str]] = {}

    def put(self, uid: str, job: JobKey, node: str) -> None:
        """The pod `uid` of `job` holds accelerators on `node` (replacing what it did)."""
        with self._lock:
            self._drop(uid)
            self._pods[uid] = (job, node)
            self._nodes.setdefault(job, Counter())[node] += 1

    def drop(self, uid: str) -> None:
        """The pod holds nothing any more."""
        with self._lock:
            self._drop(uid)

    def _drop(self, uid: str) -> None:
        found = self._pods.pop(uid, None)
        if found is None:
            return
        job, node = found
        counts = self._nodes[job]
        counts[node] -= 1
        if counts[node] <= 0:
            del counts[node]
        if not counts:
            del self._nodes[job]

    def nodes_of(self, job: JobKey) -> dict[str, int]:
        """Node -> the job's pods there (a copy)."""
        with self._lock:
            return dict(self._nodes.get(job, ()))

    def __len__(self) -> int:
        with self._lock:
            return len(self._nodes)
