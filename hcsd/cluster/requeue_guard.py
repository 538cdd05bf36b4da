"""Whether the policy that narrows the extender's `patch pods` holds.

The role grants `patch` on every pod; only the ValidatingAdmissionPolicy
`hcs-extender-requeue` (admission-requeue.yaml) narrows it to one annotation of pending pods.
That policy can be missing without any error: its file not applied, the admission plugin off,
a binding deleted, a match condition that no longer names the extender's account. Stolen
extender credentials could then change any pod's image. So before touching, and again every
`every` seconds, the extender asks the API server for a change the policy must refuse (a
label, in a dry run: nothing is written) and touches only while it is refused by that policy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

from hcsd.cluster.kube import MERGE_PATCH, Kube, KubeError

__all__ = ["POLICY", "RequeueGuard"]

log = logging.getLogger(__name__)

POLICY = "hcs-extender-requeue"
_PROBE = {"metadata": {"labels": {"hcs.io/requeue-guard": "probe"}}}
# unchecked: not asked yet; enforced: the policy refused the probe; open: the API server
# accepted it (no policy in the way); forbidden: refused by something else (no patch right:
# requeue.enabled=false); error: no answer.
STATES = ("unchecked", "enforced", "open", "forbidden", "error")
_RETRY = 30.0  # s before asking again after no answer or a pod gone


class RequeueGuard:
    def __init__(
        self,
        kube: Kube,
        registry: CollectorRegistry,
        *,
        own: tuple[str, str] | None = None,
        every: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.own = own  # (namespace, name) of the extender's pod: the downward API
        self.every = every
        self.clock = clock
        self.state = "unchecked"
        self._next = 0.0
        self._lock = threading.Lock()
        gauge = Gauge(
            "hcs_extender_requeue_guard",
            "1 for the state of the check that hcs-extender-requeue narrows the extender's "
            "pod patches (enforced: requeue on; anything else: requeue off).",
            ["state"], registry=registry,
        )  # fmt: skip
        for state in STATES:
            gauge.labels(state).set_function(self._is(state))

    def _is(self, state: str) -> Callable[[], float]:
        return lambda: float(self.state == state)

    def allows(self, fallback: tuple[str, str] | None = None) -> bool:
        """Whether touching is safe now; asks the API server when the last answer is
        `every` seconds old, about the extender's own pod or else `fallback` (any pod)."""
        with self._lock:
            if self.clock() >= self._next:
                target = self.own or fallback
                if target is not None:
                    self._check(*target)
            return self.state == "enforced"

    def _check(self, namespace: str, name: str) -> None:
        now = self.clock()
        try:
            self.kube.request(
                "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}",
                query=[("dryRun", "All")], body=_PROBE, content_type=MERGE_PATCH,
            )  # fmt: skip
        except KubeError as e:
            if e.status in (403, 422) and POLICY in str(e):
                self._set("enforced", now + self.every)
            elif e.status == 403:
                self._set("forbidden", now + self.every)
                log.warning("requeue off: the extender may not patch pods (%s)", e)
            else:  # no answer, or the pod went: ask again soon, meanwhile no touch
                self._set("error" if e.status != 404 else self.state, now + _RETRY)
                if e.status != 404:
                    log.warning("requeue off until the policy check answers: %s", e)
            return
        self._set("open", now + self.every)
        log.error(
            "requeue off: the API server let the extender change a pod's labels; the "
            "ValidatingAdmissionPolicy %s is missing or does not match the extender's account "
            "(docs/security.md). Apply it, or set requeue.enabled=false to drop `patch pods`.",
            POLICY,
        )

    def _set(self, state: str, next_check: float) -> None:
        if state == "enforced" and self.state != "enforced":
            log.info("requeue on: %s refuses anything but the touch", POLICY)
        self.state, self._next = state, next_check
