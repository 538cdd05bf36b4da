"""Which scheduler assignments this node accepts, and for how long it remembers them.

A pod's FIRST container on this node needs an assignment that verifies with a key the node
holds now and was issued at most `runtime.assignment_max_age` (minutes) before the pod's
sandbox started here: a stolen or replayed annotation is worth little, while an image pull,
a volume attach or a late key delivery between the sandbox and the first container (often
longer than the window) refuses nothing. The sandbox's start is what the NRI plugin sees
(RunPodSandbox), kept in memory per pod uid until the sandbox is removed; front ends with no
sandbox event (the runc wrapper, the OCI hook) and a pod whose sandbox started before hcsd
measure the age at the first container, as before.

Once accepted, the ledger remembers the pod uid with the sha256 of the annotation's exact
text. Any later container of that pod whose annotation is the
same text (a restart on day 8, another container, after an hcsd restart, after the key that
signed it was retired) is accepted without the age check and without its key: the text was
verified once, the ledger is root's, and only the same pod uid can present it. A different
text for the same pod is verified as new.

A pod is forgotten once none of its containers has held an allocation for
`runtime.assignment_forget_after` seconds (longer than kubelet's 5-minute restart back-off):
it is gone, so the ledger does not grow with every pod the node ever ran. The idle time is
counted in memory from the first sweep that finds the pod holding nothing (sweeps run at
every stop and removal, at each reconcile with the runtime and with the periodic sweep of
quota directories), so an hcsd restart starts it again: a later forgetting, never an earlier.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping

from hcsd.contract.assignment import Assignment, check_bound, digest, parse, verify
from hcsd.model import Acceptance
from hcsd.service import NodeService

__all__ = ["Acceptances"]

log = logging.getLogger(__name__)

_MAX_SANDBOXES = 65_536  # pods whose sandbox start is remembered; far above a node's pods


class Acceptances:
    """The node's memory of accepted assignments (in the ledger, through `service`) and of
    when each pod's sandbox started (in memory): `check` decides, `sweep` forgets."""

    def __init__(
        self,
        service: NodeService,
        keys: Callable[[], Mapping[str, bytes]],
        *,
        node: str,
        max_age: float,
        forget_after: float,
        clock: Callable[[], float],
    ) -> None:
        self.service = service
        self.keys = keys
        self.node = node
        self.max_age = max_age
        self.forget_after = forget_after
        self.clock = clock
        self._idle_since: dict[str, float] = {}  # pod uid -> when it was first seen holding none
        self._sandboxes: OrderedDict[str, float] = OrderedDict()  # pod uid -> started (clock)

    def sandbox_started(self, pod_uid: str) -> None:
        """The runtime started the pod's sandbox now (the first start counts: a sandbox
        recreated later does not move the window)."""
        if not pod_uid or pod_uid in self._sandboxes:
            return
        self._sandboxes[pod_uid] = self.clock()
        while len(self._sandboxes) > _MAX_SANDBOXES:
            self._sandboxes.popitem(last=False)

    def sandbox_removed(self, pod_uid: str) -> None:
        self._sandboxes.pop(pod_uid, None)

    def check(self, text: str, pod_uid: str) -> Assignment:
        """The assignment, if this node accepts it for the pod (AssignmentError if not);
        a first acceptance is made durable before the caller holds anything."""
        known = self.service.acceptance(pod_uid)
        fingerprint = digest(text)
        if known is not None and known.digest == fingerprint:
            assignment = parse(text)
            check_bound(assignment, node=self.node, pod_uid=pod_uid)
            return assignment
        now = self.clock()
        started = min(self._sandboxes.get(pod_uid, now), now)
        assignment = verify(
            text, self.keys(), node=self.node, pod_uid=pod_uid, now=started, max_age=self.max_age
        )
        self.service.accept(Acceptance(pod_uid, fingerprint, now))
        self._idle_since.pop(pod_uid, None)
        return assignment

    def sweep(self) -> list[str]:
        """Forget the pods that have held no allocation for `forget_after`; their uids."""
        accepted = self.service.acceptances()
        if not accepted:
            return []
        now = self.clock()
        holding = {a.pod.uid for a in self.service.allocations()}
        forgotten = []
        for acceptance in accepted:
            uid = acceptance.pod_uid
            if uid in holding:
                self._idle_since.pop(uid, None)
                continue
            idle = self._idle_since.setdefault(uid, now)
            if now - idle >= self.forget_after:
                self.service.forget_pod(uid)
                self._idle_since.pop(uid, None)
                forgotten.append(uid)
        if forgotten:
            log.info(
                "forgot the accepted assignments of %d pod(s) without containers for %.0fs: %s",
                len(forgotten),
                self.forget_after,
                ", ".join(forgotten),
            )
        return forgotten
