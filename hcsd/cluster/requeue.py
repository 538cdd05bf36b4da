"""Requeue: tell kube-scheduler when a pod the extender refused fits now.

kube-scheduler retries a pod an extender refused on any event it watches (pods, Nodes,
storage: the extender's catch-all queueing hint), and after 5 minutes otherwise. What frees
HCS capacity mostly shows where it does not look: a ComputeNode's status (hcsd released a
slice, a node fetched the signing key) or the extender's own view of a deleted pod, which may
lag kube-scheduler's. So the extender remembers the pods it refused (by uid, bounded) and,
when its state changes, touches those that fit now: a merge patch of one annotation,
`hcs.io/capacity-freed`, which kube-scheduler takes as an update of the pending pod and
moves it to the active queue, or to the backoff queue while its back-off runs (docs/cluster.md,
Requeue, has the scheduler's side and the cost).

Touched are only pods that fit a node whose change can have made room (among the nodes
kube-scheduler offered them), at most `per_node` per node and step (the binds they make
change the node again, so the next ones follow), each pod once per refusal and at most once
per back-off (1 s, doubling to 30 s), all at most `rate` a second. Pods that still do not
fit are never touched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from hcsd.cluster.compute_quota import Amounts, Quota
from hcsd.cluster.decisions import Decider, floor_of, lacks_key, over_quota
from hcsd.cluster.demand import Demand
from hcsd.cluster.kube import Kube, KubeError
from hcsd.cluster.requeue_guard import RequeueGuard
from hcsd.cluster.requeue_records import (
    ALL,
    FRESH,
    MISSED,
    SEEN,
    Ask,
    Refused,
    made_room,
    outcome,
    stamp,
)
from hcsd.cluster.state import ClusterState, Snapshot
from hcsd.contract.names import ANNOTATION_CAPACITY_FREED

__all__ = ["Refused", "Requeuer"]

log = logging.getLogger(__name__)

_PODS = 10_000  # refused pods remembered; the oldest go first
_FORGET = 330.0  # s without a refusal: kube-scheduler's 5-minute flush has retried it
_LISTS = 64  # distinct candidate node lists kept
_SHORT_LIST = 100  # kube-scheduler stops filtering at >= 100 feasible nodes: maybe cut short
_BACKOFF, _MAX_BACKOFF = 1.0, 30.0
# Steps whose changed nodes are kept for MISSED pods (>= 51 s at 100 ms). Changed, not only
# freed: a node taken and freed again between two steps shows no fall in usage.
_HISTORY = 512
_BUDGET = 0.005  # s of decisions a step; the pods left wait for the next step


class Requeuer:
    def __init__(
        self,
        kube: Kube,
        state: ClusterState,
        decider: Decider,
        signing: Callable[[], str],
        registry: CollectorRegistry,
        *,
        is_leader: Callable[[], bool] = lambda: True,
        guard: RequeueGuard | None = None,
        rate: float = 50.0,
        per_node: int = 4,
        budget: float = _BUDGET,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.state = state
        self.decider = decider
        self.signing = signing
        self.is_leader = is_leader
        self.guard = guard  # None: no policy to check (tests); else touch only while it holds
        self.rate = rate
        self.per_node = per_node
        self.budget = budget
        self.clock = clock
        self._lock = threading.Lock()
        self._pods: dict[str, Refused] = {}  # guarded by _lock, in refusal order
        self._lists: dict[int, frozenset[str]] = {}  # guarded by _lock
        # The worker's own (one thread): what it has seen.
        self._version = -1
        self._last: Snapshot | None = None  # the last step's, and when it was taken
        self._last_seen = 0.0
        self._capped: set[str] = set()  # nodes where per_node left fitting pods untouched
        self._recheck: set[str] = set()  # nodes to look at again (a touch did not land)
        self._steps = 0
        self._history: deque[tuple[int, set[str]]] = deque(maxlen=_HISTORY)  # (step, changed)
        self._tokens = rate
        self._filled = clock()
        self._stopping = threading.Event()
        self._denied_logged = -1e9
        self.touches = Counter(
            "hcs_extender_requeue_touches",
            "Refused pods touched because they fit now, by result (touched, gone, denied, failed).",
            ["result"], registry=registry,
        )  # fmt: skip
        Gauge(
            "hcs_extender_requeue_pods", "Refused pods remembered for a requeue.",
            registry=registry,
        ).set_function(lambda: len(self._pods))  # fmt: skip

    # --- from filter -------------------------------------------------------------------

    def filtered(
        self,
        pod: Mapping[str, Any],
        demand: Demand,
        names: Sequence[str],
        passed: bool,
        *,
        quotas: Sequence[Quota] = (),
        used: Amounts | None = None,
    ) -> None:
        """A filter's outcome: a pod refused on every node is remembered, one that passed
        somewhere is forgotten (kube-scheduler binds it or retries it itself)."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid:
            return
        if passed:
            with self._lock:
                self._pods.pop(uid, None)
            return
        quota_bound = bool(quotas) and (
            over_quota(quotas, used or Amounts(), floor_of(demand)) is not None
        )
        spec = pod.get("spec") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        priority, now = int(spec.get("priority") or 0), self.clock()
        # Not judged against the ComputeNodes: in a mixed cluster the offer counts Nodes HCS
        # never sees, so 500 names of 5,000 Nodes can hold fewer than the 400 ComputeNodes.
        cut_short = len(names) >= _SHORT_LIST
        with self._lock:
            candidates = None if cut_short else self._candidates(names)
            old = self._pods.pop(uid, None)
            if old is None:
                old = Refused(uid, namespace, name, demand, candidates, priority, now, quota_bound)
                old.look = FRESH
            else:  # the same object: the worker may hold it
                old.demand, old.candidates, old.priority = demand, candidates, priority
                old.refused_at, old.quota_bound, old.queued = now, quota_bound, False
                old.look = max(old.look, FRESH)
                old.generation += 1
            self._pods[uid] = old  # last in refusal order
            while len(self._pods) > _PODS:
                del self._pods[next(iter(self._pods))]

    def _candidates(self, names: Sequence[str]) -> frozenset[str]:
        """Under the lock: the offered nodes, one shared set per distinct list."""
        key = hash(tuple(names))
        found = self._lists.get(key)
        if found is None:
            if len(self._lists) >= _LISTS:
                self._lists.clear()
            found = self._lists[key] = frozenset(names)
        return found

    # --- the worker --------------------------------------------------------------------

    def start(self, every: float = 0.1) -> Requeuer:
        threading.Thread(target=self.run, args=(every,), name="requeue", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopping.set()

    def run(self, every: float) -> None:
        """A step every `every` seconds, or twice as long as the last step took: the worker
        takes at most a third of a core from filter, however many pods wait."""
        self.state.wait_synced(timeout=300)
        pause = every
        while not self._stopping.wait(pause):
            started = time.perf_counter()
            try:
                if self.is_leader():
                    self.step()
            except Exception:  # one bad step must not end requeueing for good
                log.exception("requeue step failed")
            pause = max(every, 2 * (time.perf_counter() - started))

    def step(self) -> int:
        """Touch the remembered pods that fit on what changed since the last step; the
        number touched. Nothing while the guard finds the policy missing: the changes wait
        in the change log for the step after it holds again."""
        if self.guard is not None:
            with self._lock:
                first = next(iter(self._pods.values()), None)
            if first is not None and not self.guard.allows((first.namespace, first.name)):
                return 0
        snapshot, seen = self.state.snapshot(), time.monotonic()  # heartbeats' clock
        changed = self.state.changed_between(self._version, snapshot.version)
        if self._version < 0 or changed is None:
            changed = set(snapshot.nodes)
        signing = self.signing()
        freed = {
            n
            for n in changed
            if n in self._capped
            or made_room(self._last, self._last_seen, snapshot, seen, name=n, signing=signing)
        }
        self._capped -= changed
        freed |= self._recheck
        changed |= self._recheck
        self._recheck = set()
        self._version = snapshot.version
        self._last, self._last_seen = snapshot, seen
        self._steps += 1
        self._history.append((self._steps, changed))
        now = self.clock()
        with self._lock:  # O(pods) copying only: filter waits on this lock
            for uid in [u for u, r in self._pods.items() if now - r.refused_at > _FORGET]:
                del self._pods[uid]
            waiting = []  # what to ask for each pod, copied: filter rewrites the fields
            for pod in self._pods.values():
                if pod.queued:
                    continue  # touched, and kube-scheduler has not refused it since
                if pod.next_touch > now:  # backing off: what changes meanwhile waits for it
                    if changed:
                        pod.look = MISSED
                    continue
                waiting.append(Ask(
                    -pod.priority, pod.refused_at, pod, pod.look, pod.demand, pod.candidates,
                    pod.quota_bound, pod.generation, pod.looked,
                ))  # fmt: skip
                pod.look, pod.looked = SEEN, self._steps  # a refusal makes it FRESH again
        waiting.sort(key=lambda a: (a.rank, a.refused_at))  # by priority then age, unlocked
        pools = {SEEN: freed, FRESH: changed, ALL: set(snapshot.nodes)}
        chosen = self._choose(snapshot, waiting, pools, seen=seen, signing=signing)
        return self._touch(chosen, now)

    def _missed(self, looked: int, pools: dict[int, set[str]]) -> set[str]:
        """The nodes changed after step `looked` (its back-off or the step budget hid them
        from the pod); every node when that is older than the history kept."""
        if not self._history or looked < self._history[0][0] - 1:
            return pools[ALL]
        found: set[str] = set()
        for step, freed in self._history:
            if step > looked:
                found |= freed
        return found

    def _choose(
        self,
        snapshot: Snapshot,
        waiting: list[Ask],
        pools: dict[int, set[str]],
        *,
        seen: float,
        signing: str,
    ) -> list[tuple[Refused, str]]:
        """(pod, node) to touch. Where a pod fits is worked out once per step for all the
        pods that ask the same of the same nodes (pods of one job, replicas)."""
        used: dict[str, Amounts] = {}
        fitting: dict[tuple[object, ...], list[str]] = {}
        per_node: dict[str, int] = {}
        chosen = []
        started = time.perf_counter()
        for done, ask in enumerate(waiting):
            if done and time.perf_counter() - started > self.budget:  # one at least
                self._defer(waiting[done:])
                break
            pod, demand, namespace = ask.pod, ask.demand, ask.pod.namespace
            quotas = snapshot.quotas_in(namespace)
            if quotas and namespace not in used:
                used[namespace] = self.state.namespace_usage(namespace)
            spent = used.get(namespace, Amounts())
            if quotas and over_quota(quotas, spent, floor_of(demand)):
                continue  # still over its namespace's quota wherever it goes
            # The quota refused it and now would not: all its nodes, once (then as any pod).
            where = ALL if ask.quota_bound else ask.look
            if ask.quota_bound:
                with self._lock:  # unless a refusal since said otherwise
                    if pod.generation == ask.generation:
                        pod.quota_bound = False
            candidates = ask.candidates
            key = (
                self.decider.demand_id(demand), id(candidates), where,
                namespace if quotas else "", ask.looked if where == MISSED else 0,
            )  # fmt: skip
            nodes = fitting.get(key)
            if nodes is None:
                pool = self._missed(ask.looked, pools) if where == MISSED else pools[where]
                nodes = fitting[key] = [
                    name
                    for name in pool
                    if (candidates is None or name in candidates)
                    and self._fits(
                        snapshot, demand, name, signing=signing, quotas=quotas, used=spent, now=seen
                    )
                ]
            for name in nodes:
                if per_node.get(name, 0) < self.per_node:
                    per_node[name] = per_node.get(name, 0) + 1
                    chosen.append((pod, name))
                    break
            else:
                if nodes:  # fits, but its nodes' share of touches is spent this step
                    self._capped.update(nodes)
        return chosen

    def _defer(self, asks: list[Ask]) -> None:
        """Pods the step's budget did not reach: the next step asks about what made room
        since they were last asked about."""
        with self._lock:
            for ask in asks:
                # SEEN or FRESH: what changed in this step; MISSED: since its last look.
                looked = ask.looked if ask.look >= MISSED else self._steps - 1
                ask.pod.looked = looked
                ask.pod.look = max(ask.pod.look, MISSED, ask.look)

    def _fits(
        self,
        snapshot: Snapshot,
        demand: Demand,
        name: str,
        *,
        signing: str,
        quotas: Sequence[Quota],
        used: Amounts,
        now: float,
    ) -> bool:
        """Filter's rule for one node (decisions.Decider._judge): fits, holds the signing
        key, keeps the namespace within its quotas."""
        demand_id = self.decider.demand_id(demand)
        _, reason, amounts = self.decider.answer(snapshot, demand, demand_id, name, now)
        if reason:
            return False
        if signing and lacks_key(snapshot.nodes[name].view, signing):
            return False
        return not (quotas and over_quota(quotas, used, amounts))

    def _touch(self, chosen: list[tuple[Refused, str]], now: float) -> int:
        self._tokens = min(self.rate, self._tokens + (now - self._filled) * self.rate)
        self._filled = now
        touched = 0
        for pod, node in chosen:
            if self._tokens < 1:
                self._recheck.add(node)  # the next step tries again
                continue
            self._tokens -= 1
            with self._lock:  # queued before the patch: a refusal meanwhile clears it
                generation = pod.generation
                pod.touches += 1
                pod.next_touch = now + min(_MAX_BACKOFF, _BACKOFF * 2 ** (pod.touches - 1))
                pod.queued = True
                namespace, name, uid = pod.namespace, pod.name, pod.uid
            body = {"metadata": {
                "uid": uid,  # a precondition: never touch a new pod of the same name
                "annotations": {ANNOTATION_CAPACITY_FREED: stamp()},
            }}  # fmt: skip
            try:
                self.kube.patch(f"/api/v1/namespaces/{namespace}/pods/{name}", body)
            except KubeError as e:
                with self._lock:
                    if pod.generation == generation:
                        pod.queued = False
                self._failed(pod, node, e)
                continue
            self.touches.labels("touched").inc()
            touched += 1
            log.info("%s/%s fits on %s now: touched", namespace, name, node)
        return touched

    def _failed(self, pod: Refused, node: str, e: KubeError) -> None:
        """A touch the API server refused (requeue_records.outcome); a denial is logged with
        the server's message at most once a minute."""
        result = outcome(e.status, str(e))
        self.touches.labels(result).inc()
        if result == "failed":
            pod.look = max(pod.look, MISSED)  # what freed its room is behind it: look again
            pod.looked = min(pod.looked, self._steps - 1)
            log.warning("cannot touch %s/%s: %s", pod.namespace, pod.name, e)
            return
        self._forget(pod.uid)
        self._recheck.add(node)  # what it would have taken is still free
        now = time.monotonic()
        if result == "denied" and now - self._denied_logged >= 60.0:
            self._denied_logged = now
            log.warning("touch of %s/%s denied: %s", pod.namespace, pod.name, e)

    def _forget(self, uid: str) -> None:
        with self._lock:
            self._pods.pop(uid, None)

    def remembered(self) -> list[str]:
        """The uids of the refused pods remembered, oldest refusal first (tests, metrics)."""
        with self._lock:
            return list(self._pods)
