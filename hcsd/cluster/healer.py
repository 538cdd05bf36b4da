"""hcs-controller's loop: isolate failed devices' pods, taint dead nodes, mark slow devices.

Two informers (ComputeNodes, and bound pods whose assignment names devices) wake one loop,
which also runs every `interval` seconds (backoffs and the quiet period are timed). While this
replica holds the Lease, each round:
1. writes `status.fleet` of each ComputeNode whose slow devices changed (healer_fleet);
2. per node, finds the devices to isolate (healer_policy.faults) and the pods holding them;
   each such pod (bound to that node) gets an Event and is evicted through the Eviction API,
   once, then DisruptionTarget's reason HCSDeviceFailed; a PodDisruptionBudget's 429 is
   retried with a backoff (within the brakes of healer_limits); a pod
   annotated `hcs.io/eviction: never` is left alone (an Event says so, once);
3. taints the Node when all (or more than the policy's share) of its devices are bad, and
   takes the taint off when they have been good for the quiet period.
Every action is an Event (on the pod, and on the ComputeNode: the reasons are healer_actions'
tables) and a metric. Nothing is
remembered across a change of leader but what the API server holds (a pod being deleted, the
taint, `status.fleet`), so a new leader repeats no eviction and loses none.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hcsd.cluster import healer_actions as act
from hcsd.cluster.healer_fleet import FleetPolicy, fleet_status, outliers
from hcsd.cluster.healer_limits import Breaker, Debounce, Limits, TokenBucket, breaker_state
from hcsd.cluster.healer_metrics import HealerMetrics
from hcsd.cluster.healer_policy import (
    PodRef,
    Policy,
    Target,
    ended,
    faults,
    holders,
    opted_out,
    pod_ref,
    should_taint,
)
from hcsd.cluster.informer import Informer
from hcsd.cluster.kube import Kube, KubeError, paths_for
from hcsd.contract.names import ANNOTATION_EVICTION, API_VERSION, COMPUTE_NODES, TAINT_UNHEALTHY
from hcsd.profiles.database import ProfileDatabase

__all__ = ["Healer", "Timing"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Timing:
    interval: float = 5.0  # a round at least this often, besides the informers' wake-ups
    backoff: float = 2.0  # first retry of a blocked or failed eviction
    backoff_max: float = 120.0
    # A Node's taints read again this often (someone may have taken ours off by hand)
    taint_reread: float = 300.0


class Healer:
    def __init__(
        self,
        kube: Kube,
        db: ProfileDatabase,
        *,
        policy: Policy | None = None,
        fleet: FleetPolicy | None = None,
        timing: Timing | None = None,
        limits: Limits | None = None,
        is_leader: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.db = db
        self.policy = policy or Policy()
        self.fleet = fleet or FleetPolicy()
        self.timing = timing or Timing()
        self.limits = limits or Limits()
        self._bucket = TokenBucket(self.limits.evictions_per_minute)
        self._debounce = Debounce(self.limits.min_bad_seconds)
        self._circuit_open = False
        self.is_leader = is_leader
        self.clock = clock
        self.metrics = HealerMetrics()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.nodes: Informer[dict[str, Any]] = Informer(
            kube,
            paths_for(API_VERSION, COMPUTE_NODES),
            dict,
            on_change=lambda *_: self._wake.set(),
            name="computenodes",
        )
        self.pods: Informer[PodRef] = Informer(
            kube,
            paths_for("v1", "pods"),
            pod_ref,
            query=[("fieldSelector", "spec.nodeName!=")],
            on_change=lambda *_: self._wake.set(),
            name="pods",
        )
        self._forget()

    def _forget(self) -> None:
        """What a term of leadership learns; a new term starts from the API server's word."""
        self._done: set[str] = set()  # pod uids evicted or gone
        self._told: set[str] = set()  # pod uids opted out, and told so (asked every round)
        self._retry: dict[str, tuple[int, float]] = {}  # uid -> attempts, next try
        self._taints: dict[str, str | None] = {}  # node -> our taint's effect, as last seen
        self._good_since: dict[str, float] = {}  # node -> when it stopped needing the taint
        self._taint_read: dict[str, float] = {}  # node -> when its taints were read
        self._leading = False
        self._throttled = 0

    # --- running ----------------------------------------------------------------------------

    def start(self) -> Healer:
        self.nodes.start()
        self.pods.start()
        self._thread = threading.Thread(target=self._run, name="healer", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> bool:
        """End the loop and wait (up to `timeout` seconds) for a round in progress; True when
        no round runs any more. Only then may the caller give the Lease back: a round still
        running after it would act beside the next leader (a round stops at its next action,
        but an API call in flight is waited out)."""
        self._stopping.set()
        self._wake.set()
        self.nodes.stop()
        self.pods.stop()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("an isolation round still runs after %.0fs", timeout)
            return False
        return True

    def _may_act(self) -> bool:
        """Asked before each action: leadership can end, or a stop come, mid-round."""
        return not self._stopping.is_set() and self.is_leader()

    def synced(self) -> bool:
        return self.nodes.synced.is_set() and self.pods.synced.is_set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.timing.interval)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self.reconcile()
            except Exception:  # one bad round must not end the controller
                log.exception("isolation round failed; next round in %.1fs", self.timing.interval)

    def reconcile(self) -> None:
        """One round: the fleet marks, then per node its taint and its pods."""
        if not self.is_leader():
            if self._leading:
                self._forget()
            self.metrics.standby()
            return
        self._leading = True
        self.metrics.leader.set(1)
        if not self.synced():
            return
        with self.nodes.lock:
            nodes = list(self.nodes.items.values())
        with self.pods.lock:
            pods = list(self.pods.items.values())
        self._mark_fleet(nodes)
        reported = {_name(n): faults(n, self.policy) for n in nodes}
        if self._breaker(breaker_state(nodes, reported, self.policy, self.limits)):
            return
        now = self.clock()
        self._debounce.prune(reported)
        seen: set[str] = set()
        blocked = self._throttled = 0
        for node in nodes:
            if not self._may_act():
                return
            bad = self._debounce.ripe(_name(node), reported[_name(node)], now)
            self._taint(node, len(bad))
            for target in holders(node, pods, bad):
                if not self._may_act():  # another replica may lead now
                    return
                seen.add(target.uid)
                blocked += self._isolate(node, target)
        names = set(reported)  # nodes gone: forgotten
        for known in (self._taints, self._good_since, self._taint_read):
            for gone in set(known) - names:
                del known[gone]
        self._done &= seen
        self._told &= seen
        self._retry = {uid: r for uid, r in self._retry.items() if uid in seen}
        self.metrics.blocked.set(blocked)
        self.metrics.throttled.set(self._throttled)
        self.metrics.tainted.set(sum(1 for effect in self._taints.values() if effect))

    def _breaker(self, state: Breaker) -> bool:
        """True (and nothing is evicted nor tainted this round) while the breaker is open."""
        self.metrics.circuit_open.set(int(state.open))
        if state.open != self._circuit_open:
            self._circuit_open = state.open
            if state.open:
                log.error("circuit breaker open: %s (more than %g); not evicting nor tainting",
                          state.summary, self.limits.breaker_share)  # fmt: skip
            else:
                log.warning("circuit breaker closed: %s; acting again", state.summary)
        return state.open

    # --- pods -------------------------------------------------------------------------------

    def _isolate(self, node: Mapping[str, Any], target: Target) -> int:
        """Condition and evict one pod; 1 when a PodDisruptionBudget holds it back."""
        if target.uid in self._done:
            return 0
        attempts, at = self._retry.get(target.uid, (0, 0.0))
        if at > self.clock():
            return 1 if attempts else 0
        try:
            pod = act.get_pod(self.kube, target.namespace, target.name)
            result = self._evict(node, pod, target)
        except KubeError as e:
            self.metrics.errors.labels("evict").inc()
            self._back_off(target.uid, attempts)
            log.warning("%s: failed to isolate: %s; retrying", target.key, e)
            return 0
        if pod is None or result in (None, act.Eviction.GONE, act.Eviction.THROTTLED):
            # opted out: read again next round; throttled: asked again next round
            if result is not act.Eviction.THROTTLED and (
                pod is None or target.uid not in self._told
            ):
                self._done.add(target.uid)
            return 0
        fault, message = target.faults[0], _message(target)
        self.metrics.evictions.labels(result.value, fault.reason).inc()
        if result is act.Eviction.BLOCKED:
            delay = self._back_off(target.uid, attempts)
            if attempts == 0:
                log.info("%s: eviction blocked by a PodDisruptionBudget; retrying", target.key)
                self._event(pod, "EvictionBlocked", f"a PodDisruptionBudget blocks it: {message}")
                why = f"a PodDisruptionBudget blocks evicting {target.key}: {message}"
                self._node_event(node, "PodEvictionBlocked", why)
            log.debug("%s: still blocked; next try in %.1fs", target.key, delay)
            return 1
        self._done.add(target.uid)
        self._restore_reason(pod, fault.reason, message)
        log.info("%s: evicted: %s", target.key, message)
        self._event(pod, "Evicted", f"evicted by hcs-controller: {message}")
        self._node_event(node, "PodEvicted", f"evicted {target.key}: {message}")
        return 0

    def _evict(
        self, node: Mapping[str, Any], pod: Mapping[str, Any] | None, target: Target
    ) -> act.Eviction | None:
        """The condition, then the eviction; None when there is nothing to do: the pod is
        gone, another pod of that name, not bound to the node that named it, being deleted,
        ended (named by an allocation not yet released: evicting it would delete the record
        of its end), or opted out (said once; one that drops the annotation is evicted)."""
        meta = (pod or {}).get("metadata") or {}
        if pod is None or not target.bound_here(pod) or meta.get("deletionTimestamp") or ended(pod):
            if pod is not None and meta.get("uid") == target.uid and not target.bound_here(pod):
                log.warning("%s: named by node %s but not bound there; ignored",
                            target.key, target.node)  # fmt: skip
            return None
        fault, message = target.faults[0], _message(target)
        if opted_out(meta.get("annotations") or {}):
            if target.uid in self._told:
                return None
            self._told.add(target.uid)
            self.metrics.evictions.labels("opted_out", fault.reason).inc()
            log.info("%s: not evicted (%s): %s", target.key, ANNOTATION_EVICTION, message)
            self._event(pod, "EvictionSkipped", f"{ANNOTATION_EVICTION}: never; {message}")
            why = f"{target.key} opted out ({ANNOTATION_EVICTION}: never): {message}"
            self._node_event(node, "PodEvictionSkipped", why)
            return None
        if self.limits.dry_run:
            self.metrics.evictions.labels("dry_run", fault.reason).inc()
            log.warning("%s: would be evicted (dry run): %s", target.key, message)
            return None
        if not self._bucket.take(self.clock()):
            self._throttled += 1
            log.debug("%s: eviction deferred: over %g a minute", target.key,
                      self.limits.evictions_per_minute)  # fmt: skip
            return act.Eviction.THROTTLED
        # No condition before the eviction: a PodDisruptionBudget may refuse it, and the
        # disruption controller takes a DisruptionTarget off a pod that was not deleted
        # (then this would set it again, round after round). The Event says why at once;
        # the Eviction API sets the condition itself, and our reason goes back after it.
        if target.uid not in self._retry:
            self._event(pod, fault.reason, message)
        return act.evict(self.kube, pod, self.policy.grace_seconds)

    def _restore_reason(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        """The Eviction API rewrites DisruptionTarget's reason to EvictionByEvictionAPI;
        ours goes back, so that the terminating pod (and the Job's record of it) says which
        device failed. The type and status, what a podFailurePolicy matches, stay."""
        try:
            act.set_condition(self.kube, pod, reason, message)
            self.metrics.conditions.labels(reason).inc()
        except KubeError as e:
            if not e.not_found:  # a zero grace period: already gone
                self.metrics.errors.labels("condition").inc()
                log.warning("failed to restore the condition's reason: %s", e)

    def _back_off(self, uid: str, attempts: int) -> float:
        delay = min(self.timing.backoff_max, self.timing.backoff * 2**attempts)
        self._retry[uid] = (attempts + 1, self.clock() + delay)
        return float(delay)

    def _event(
        self, involved: Mapping[str, Any], reason: str, message: str, *, warning: bool = True
    ) -> None:
        """An Event; one that fails is logged and counted, never retried (the action stands).
        A reason outside healer_actions' tables (a bug) costs that Event only, not the round."""
        try:
            act.post_event(self.kube, involved, reason, message, warning=warning)
        except (KubeError, ValueError) as e:  # ValueError: a reason outside the tables
            self.metrics.errors.labels("event").inc()
            log.warning("failed to record event %s: %s", reason, e)

    def _node_event(
        self, node: Mapping[str, Any], reason: str, message: str, *, warning: bool = True
    ) -> None:
        """An Event on the ComputeNode (hcs.io), where `kubectl describe computenode` shows
        what was done about its devices."""
        uid = str((node.get("metadata") or {}).get("uid", ""))
        self._event(act.compute_node_ref(_name(node), uid), reason, message, warning=warning)

    # --- nodes ------------------------------------------------------------------------------

    def _taint(self, node: Mapping[str, Any], bad: int) -> None:
        name = _name(node)
        now = self.clock()
        want = should_taint(node, bad, self.policy)
        if want:
            self._good_since.pop(name, None)
        else:
            self._good_since.setdefault(name, now)
        try:
            if (
                name not in self._taints
                or now - self._taint_read.get(name, now) >= self.timing.taint_reread
            ):
                self._taints[name] = act.taint_of(self.kube, name)
                self._taint_read[name] = now
            have = self._taints[name]
            if want and have != self.policy.taint_effect:
                if self.limits.dry_run:
                    self._taints[name] = self.policy.taint_effect  # said once
                    log.warning("node %s: would be tainted (dry run): %d bad", name, bad)
                    return
                self._taints[name] = act.set_taint(self.kube, name, self.policy.taint_effect)
                self._node_action(node, "taint", f"{bad} of its devices are bad")
            elif (
                not want
                and have is not None
                and now - self._good_since[name] >= self.policy.quiet_seconds
            ):
                if self.limits.dry_run:
                    self._taints[name] = None
                    log.warning("node %s: would be untainted (dry run)", name)
                    return
                self._taints[name] = act.set_taint(self.kube, name, None)
                self._node_action(
                    node,
                    "untaint",
                    f"its devices have been good for {self.policy.quiet_seconds:g}s",
                )
        except KubeError as e:
            if e.not_found:  # a ComputeNode whose Node is gone: nothing to taint
                self._taints[name] = None
                log.debug("node %s: no such Node", name)
                return
            self._taints.pop(name, None)  # ask again next round
            self.metrics.errors.labels("taint").inc()
            log.warning("node %s: failed to update %s: %s", name, TAINT_UNHEALTHY, e)

    def _node_action(self, node: Mapping[str, Any], action: str, why: str) -> None:
        name = _name(node)
        self.metrics.taints.labels(action).inc()
        verb = "tainted" if action == "taint" else "untainted"
        effect = self.policy.taint_effect
        log.info("node %s %s %s:%s: %s", name, verb, TAINT_UNHEALTHY, effect, why)
        self._node_event(
            node,
            "NodeTainted" if action == "taint" else "NodeUntainted",
            f"Node {name} {verb} {TAINT_UNHEALTHY}:{effect}: {why}",
            warning=action == "taint",
        )

    # --- the fleet --------------------------------------------------------------------------

    def _mark_fleet(self, nodes: list[dict[str, Any]]) -> None:
        found = outliers(nodes, self.db, self.fleet)
        self.metrics.slow.set(len(found))
        for node in nodes:
            name = _name(node)
            wanted = fleet_status([o for o in found if o.node == name], self.fleet)
            if (node.get("status") or {}).get("fleet") == wanted or not node.get("status"):
                continue
            if not self._may_act():
                return
            try:
                act.write_fleet(self.kube, name, wanted)
            except KubeError as e:
                self.metrics.errors.labels("fleet").inc()
                log.warning("ComputeNode %s: failed to write status.fleet: %s", name, e)
                continue
            summary = (wanted or {}).get("summary", "no slow devices")
            log.info("ComputeNode %s: fleet: %s", name, summary)
            self.metrics.fleet_marks.labels("mark" if wanted else "clear").inc()
            self._node_event(
                node,
                "SlowDevices" if wanted else "SlowDevicesCleared",
                str(summary),
                warning=bool(wanted),
            )


def _message(target: Target) -> str:
    return "; ".join(f.message for f in target.faults)


def _name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name", ""))
