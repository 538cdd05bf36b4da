"""Leader election on a coordination.k8s.io Lease, for the extender's and hcs-controller's
replicas.

Only the leader binds (its assume cache is what makes binds race-free) and only the leader is
ready, so the Service sends kube-scheduler to it; a standby takes over when the leader's Lease
has not been renewed for `duration` seconds. The same protocol as client-go's leaderelection:
acquire when the Lease is free or expired, renew every `renew` seconds, give up on a failed
renewal past the deadline. A replica that stops (SIGTERM: a rolling update) gives the Lease
back (`release`, client-go's ReleaseOnCancel: no holder, a one-second duration), so a standby
takes over at its next try instead of waiting out the duration.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from hcsd.cluster.kube import Kube, KubeError, lease_object, paths_for
from hcsd.cluster.timefmt import micro_time, parse_time

__all__ = ["LeaderElector"]

log = logging.getLogger(__name__)


class LeaderElector:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        *,
        duration: float = 15.0,
        renew: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.path = paths_for("coordination.k8s.io/v1", "leases", namespace, name)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self.renew = renew
        self.clock = clock
        self._leading_until = 0.0  # monotonic
        self._written = ""  # the resourceVersion of the Lease as this replica last wrote it
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def is_leader(self) -> bool:
        return time.monotonic() < self._leading_until

    def stop(self, wait: float = 0.0) -> None:
        """Stop renewing (leadership then lapses with the Lease); with `wait`, also wait up
        to that many seconds for the renewing thread to finish its round, so that what the
        round logs is written before the caller goes on."""
        self._stopping.set()
        if wait > 0 and self._thread is not None:
            self._thread.join(wait)

    def step_down(self) -> None:
        """Stop leading here at once (is_leader() is False from now) without writing the
        Lease: the caller gives it back (`release`) once nothing it started as leader runs."""
        self._leading_until = 0.0
        self.stop()

    def start(self) -> LeaderElector:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()
        return self

    def release(self, timeout: float = 5.0) -> bool:
        """Stop leading and renewing, and give the Lease back if this replica still holds it;
        True when it was given back. Leadership ends first (the caller's loop sees it at
        once); the Lease is written only after the renewing thread has ended (a renewal in
        flight would take it again), and only over the version read (a standby that took
        it meanwhile keeps it: 409, nothing done). The Lease must still be the one this
        replica last wrote (its resourceVersion), not merely name this identity: a replica
        started again under the same name, or a hand edit, is not ours to give away."""
        self._leading_until = 0.0
        self.stop()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("leader election: still renewing after %.0fs; Lease %s left to "
                            "expire", timeout, self.name)  # fmt: skip
                return False
        self._leading_until = 0.0
        try:
            lease = self.kube.get(self.path)
            spec = lease.get("spec") or {}
            version = str((lease.get("metadata") or {}).get("resourceVersion", ""))
            if spec.get("holderIdentity") != self.identity or version != self._written:
                return False
            stamp = micro_time(self.clock())
            lease["spec"] = {**self._spec(stamp, stamp, int(spec.get("leaseTransitions") or 0)),
                             "holderIdentity": "", "leaseDurationSeconds": 1}  # fmt: skip
            self.kube.replace(self.path, lease)
        except KubeError as e:
            log.warning("leader election: failed to release Lease %s: %s; it expires in "
                        "%.0fs", self.name, e, self.duration)  # fmt: skip
            return False
        log.info("%s released Lease %s", self.identity, self.name)
        return True

    def _run(self) -> None:
        while not self._stopping.is_set():
            was = self.is_leader()
            try:
                self.try_acquire()
            except KubeError as e:
                log.warning("leader election: %s", e)
            now = self.is_leader()
            if now != was:
                log.info("%s %s leadership", self.identity, "acquired" if now else "lost")
            self._stopping.wait(self.renew if now else self.renew / 2)

    def try_acquire(self) -> bool:
        """One round: take or renew the Lease if we may; True when we lead after it."""
        started = time.monotonic()
        stamp = micro_time(self.clock())
        try:
            lease = self.kube.get(self.path)
        except KubeError as e:
            if not e.not_found:
                raise
            body = lease_object(self.name, self.namespace, self._spec(stamp, stamp, 0))
            try:
                created = self.kube.create(self.path.rsplit("/", 1)[0], body)
            except KubeError as e2:
                if e2.conflict:
                    return False
                raise
            self._wrote(created)
            self._leading_until = started + self.duration
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        renewed = parse_time(str(spec.get("renewTime") or "")) or 0.0
        duration = float(spec.get("leaseDurationSeconds") or self.duration)
        expired = self.clock() > renewed + duration
        if holder != self.identity and not expired and holder:
            self._leading_until = 0.0
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (holder != self.identity)
        acquired = stamp if holder != self.identity else str(spec.get("acquireTime") or stamp)
        lease["spec"] = self._spec(acquired, stamp, transitions)
        try:
            self._wrote(self.kube.replace(self.path, lease))
        except KubeError as e:
            if e.conflict:
                self._leading_until = 0.0
                return False
            raise
        self._leading_until = started + self.duration
        return True

    def _wrote(self, lease: Mapping[str, Any]) -> None:
        self._written = str((lease.get("metadata") or {}).get("resourceVersion", ""))

    def _spec(self, acquired: str, renewed: str, transitions: int) -> dict[str, object]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.duration),
            "acquireTime": acquired,
            "renewTime": renewed,
            "leaseTransitions": transitions,
        }
