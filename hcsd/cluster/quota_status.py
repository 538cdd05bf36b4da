"""The ComputeQuota status writer: `status.used` as the extender counts it, written on change.

A reconciliation, level-triggered: each pass sums what the namespace's pods hold now (the
bound pods whose assignment verifies, `holds.pod_info`, plus the binds this process has just
made) and writes it where the quota's status says otherwise, at start and every few seconds.
Nothing is remembered between passes, so a restart, a pod deleted while the extender was
away, or a status someone else wrote are all settled by the next pass.

Only the leader writes (its assume cache is the one that binds); every replica counts the
same pods, so a new leader carries on where the old one stopped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from hcsd.cluster.kube import Kube, KubeError, paths_for
from hcsd.cluster.state import ClusterState
from hcsd.contract.names import API_VERSION, COMPUTE_QUOTAS

__all__ = ["QuotaStatusWriter"]

log = logging.getLogger(__name__)


class QuotaStatusWriter:
    def __init__(self, kube: Kube, state: ClusterState) -> None:
        self.kube = kube
        self.state = state

    def write_changed(self) -> int:
        """Write each ComputeQuota's `status.used` where it changed; the number written."""
        written = 0
        for quota in self.state.snapshot().quotas:
            used = self.state.namespace_usage(quota.namespace).as_status()
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

    def run(self, stopping: threading.Event, every: float, is_leader: Callable[[], bool]) -> None:
        """At once (the caches are synced), then every `every` seconds while leading, until
        `stopping` is set."""
        while True:
            if is_leader():
                self.write_changed()
            if stopping.wait(every):
                return
