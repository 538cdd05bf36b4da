"""Filter and prioritize: where a pod may go and how good each node is for it.

Every decision reads one `Snapshot` of the cluster state and writes nothing but its caches.
One decision, three cache levels, one name each:

- **plan**: the allocator's full answer (`planner.plan`) for a demand on a node *shape*
  (devices and usage, not the node's name): cached by (shape id, demand id), so equal nodes
  share it. Bind asks for a `fresh_plan`, never cached.
- **answer**: (score, why not, amounts) for a demand on one `NodeSnapshot`, memoised on the
  snapshot (it goes when the node changes). A new demand of the common kind (one container,
  one VRAM slice) is a binary search over the node's summary instead of a plan.
- **verdict**: the filter's answer for a demand over one node list, cached by (demand id,
  node list). kube-scheduler sends the same list pod after pod, and pods of one job ask the
  same thing, so the next pod's verdict re-answers only the nodes changed since.

A verdict decided afresh for the common kind does not go node by node: `bulk.py` decides the
whole list at once over the snapshot's `FleetIndex` (numpy arrays), with the allocator's rule,
and asks `planner.plan` only once per distinct failure (reason signature) for its wording.

The caches are memos of pure functions of immutable inputs, so threads racing on one can
only compute the same value twice; each change to them is one dict operation (atomic under
the GIL), and the ids they key on come from counters that never hand out a number twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from hcsd.cluster import planner
from hcsd.cluster.bulk import Bulk, one_slice
from hcsd.cluster.compute_quota import Amounts, Quota
from hcsd.cluster.demand import Cover, Demand, DemandError, demand_of
from hcsd.cluster.eligibility import (
    NOTHING,
    Verdict,
    floor_of,
    lacks_key,
    over_quota,
    plan_amounts,
    reason_of,
    unusable,
)
from hcsd.cluster.extender_metrics import Metrics
from hcsd.cluster.planner import Plan, Unfit, expand_models, quick_fit
from hcsd.cluster.runtime_profiles import RuntimeProfile, cover_of, profile_named
from hcsd.cluster.state import Answer, NodeSnapshot, Snapshot
from hcsd.contract.names import ANNOTATION_RUNTIME_PROFILE, RUNTIME_PROFILES
from hcsd.profiles.database import ProfileDatabase

# The eligibility names are re-exported: bind, requeue and the tests import them from here.
__all__ = [
    "NOTHING", "Decider", "Verdict", "floor_of", "lacks_key", "over_quota", "plan_amounts",
    "unusable",
]  # fmt: skip

_PLANS = 50_000
_VERDICTS = 256
_ANSWERS = 64  # per node snapshot
_DEMANDS = 50_000
_COVERS = 1024


class Decider:
    def __init__(
        self,
        db: ProfileDatabase,
        metrics: Metrics,
        changed_between: Callable[[int, int], set[str] | None],
        profiles: Callable[[str], RuntimeProfile | None] = lambda name: None,
        profiles_listed: Callable[[], bool] = lambda: True,
        *,
        profiles_on: bool = True,
    ) -> None:
        self.db = db
        self.profiles = profiles  # RuntimeProfiles by name, as the informer keeps them
        self.profiles_listed = profiles_listed
        self.profiles_on = profiles_on  # off: --no-runtime-profiles (the chart's switch)
        self._covers: dict[tuple[str, str], Cover] = {}
        self.metrics = metrics
        self.changed_between = changed_between  # ClusterState's change log
        self._demand_ids: dict[Demand, int] = {}
        self._next_demand = itertools.count()
        self._plans: OrderedDict[tuple[int, int], Plan | Unfit] = OrderedDict()
        self._verdicts: OrderedDict[tuple[int, int], Verdict] = OrderedDict()
        self._last: tuple[str, Mapping[str, int]] = ("", {})  # pod uid, its filter's scores
        self._bulk = Bulk()

    def demand(self, pod: Mapping[str, Any]) -> Demand | None:
        """The pod's demand with model aliases resolved and its RuntimeProfile's cover;
        DemandError when malformed or when it names a profile that does not exist."""
        demand = demand_of(pod)
        if demand is not None and demand.models:
            demand = dataclasses.replace(demand, models=expand_models(demand.models, self.db))
        if demand is not None:
            name = profile_named(pod)
            if name is not None:
                demand = dataclasses.replace(demand, cover=self._cover(name))
        return demand

    def _cover(self, name: str) -> Cover:
        if not self.profiles_on:
            raise DemandError(
                f"{ANNOTATION_RUNTIME_PROFILE}: runtime profiles are off in this cluster "
                "(hcs-scheduler-extender --no-runtime-profiles: the chart's "
                "runtimeProfiles.enabled=false)"
            )
        profile = self.profiles(name)
        if profile is None:
            if not self.profiles_listed():
                raise DemandError(
                    f"{ANNOTATION_RUNTIME_PROFILE}: the RuntimeProfiles are not listed yet "
                    f"(is the CRD {RUNTIME_PROFILES}.hcs.io installed?)"
                )
            raise DemandError(
                f"{ANNOTATION_RUNTIME_PROFILE}: RuntimeProfile {name!r} does not exist "
                f"(kubectl get {RUNTIME_PROFILES})"
            )
        key = (name, profile.resource_version)
        found = self._covers.get(key)
        if found is None:
            if len(self._covers) > _COVERS:
                self._covers.clear()
            found = self._covers[key] = cover_of(profile, self.db)
        return found

    def demand_id(self, demand: Demand) -> int:
        """A small number per distinct demand: a cheap key for the caches."""
        found = self._demand_ids.get(demand)
        if found is None:
            if len(self._demand_ids) > _DEMANDS:
                self._demand_ids.clear()  # ids are never reused: old memos just go unread
            found = self._demand_ids.setdefault(demand, next(self._next_demand))
        return found

    # --- filter ------------------------------------------------------------------------

    def filter(
        self,
        snapshot: Snapshot,
        uid: str,
        demand: Demand,
        names: Sequence[str],
        *,
        quotas: Sequence[Quota] = (),
        used: Amounts = NOTHING,
        signing: str = "",
    ) -> Verdict:
        """Which of `names` can take the pod (scores) and why not the others (failed);
        `signing`: the key id a bind would sign with (nodes without it fail)."""
        floor = floor_of(demand)
        for quota in quotas:
            reason = quota.excess(used, floor)
            if reason is not None:
                self.metrics.refuse("quota", len(names))
                return Verdict(snapshot.version, 0.0, {n: reason for n in names}, {})
        demand_id = self.demand_id(demand)
        if quotas:  # the namespace's usage moves with every pod: nothing to reuse
            verdict = self._verdict(
                snapshot, demand, demand_id, names, quotas=quotas, used=used, signing=signing
            )
        else:
            verdict = self._cached_verdict(snapshot, demand, demand_id, names, signing)
        if verdict.failed:
            self.metrics.refuse("unfit", len(verdict.failed))
        self._last = (uid, verdict.scores)
        return verdict

    def _verdict(
        self,
        snapshot: Snapshot,
        demand: Demand,
        demand_id: int,
        names: Sequence[str],
        *,
        quotas: Sequence[Quota] = (),
        used: Amounts = NOTHING,
        signing: str = "",
    ) -> Verdict:
        failed: dict[str, str] = {}
        scores: dict[str, int] = {}
        valid_until, rest = math.inf, names
        want = one_slice(demand)
        if want is not None:  # all at once (bulk.py); its maps are new, ours to fill
            now = time.monotonic()
            nodes = snapshot.nodes
            found = self._bulk.judge(
                snapshot.fleet, demand, want, names, now,
                unusable=lambda n: unusable(snapshot, n, now) or "node is not usable",
                reason=lambda n: self._bulkreason_of(nodes[n], demand, demand_id),
                key_refusal=(lambda n: lacks_key(nodes[n].view, signing)) if signing else None,
                quota_refusal=over_quota(quotas, used, floor_of(demand)) if quotas else None,
            )  # fmt: skip
            failed, scores, valid_until = found.failed, found.scores, found.valid_until
            rest = found.undecided  # none, unless the reference disagreed: decided one by one
        valid_until = self._judge(
            snapshot, demand, demand_id, rest,
            into=(failed, scores), valid_until=valid_until, quotas=quotas, used=used,
            signing=signing,
        )  # fmt: skip
        return Verdict(snapshot.version, valid_until, failed, scores)

    def _cached_verdict(
        self,
        snapshot: Snapshot,
        demand: Demand,
        demand_id: int,
        names: Sequence[str],
        signing: str,
    ) -> Verdict:
        key = (demand_id, hash((signing, *names)))  # a new signing id: judged afresh
        cached = self._verdicts.get(key)
        if (
            cached is not None
            and time.monotonic() < cached.valid_until
            and cached.version <= snapshot.version
        ):
            changed = self.changed_between(cached.version, snapshot.version)
            if changed is not None:
                relevant = [n for n in changed if n in cached.scores or n in cached.failed]
                if relevant:  # copy, then re-answer the nodes that changed
                    failed, scores = dict(cached.failed), dict(cached.scores)
                    valid_until = self._judge(
                        snapshot, demand, demand_id, relevant,
                        into=(failed, scores), valid_until=cached.valid_until,
                        signing=signing,
                    )  # fmt: skip
                    verdict = Verdict(snapshot.version, valid_until, failed, scores)
                else:  # the same answer, brought up to this snapshot's version
                    verdict = dataclasses.replace(cached, version=snapshot.version)
                self._keep(key, verdict)
                return verdict
        verdict = self._verdict(snapshot, demand, demand_id, names, signing=signing)
        self._keep(key, verdict)
        return verdict

    def _keep(self, key: tuple[int, int], verdict: Verdict) -> None:
        self._verdicts[key] = verdict
        try:
            self._verdicts.move_to_end(key)
            while len(self._verdicts) > _VERDICTS:
                self._verdicts.popitem(last=False)
        except KeyError:
            pass  # another thread evicted it meanwhile: a cache miss later, nothing worse

    def _judge(
        self,
        snapshot: Snapshot,
        demand: Demand,
        demand_id: int,
        names: Sequence[str],
        *,
        into: tuple[dict[str, str], dict[str, int]],
        valid_until: float,
        quotas: Sequence[Quota] = (),
        used: Amounts = NOTHING,
        signing: str = "",
    ) -> float:
        """Answer each of `names` into failed or scores; the verdict's new valid_until."""
        failed, scores = into
        now = time.monotonic()
        beats = snapshot.heartbeats
        for name in names:
            score, reason, amounts = self.answer(snapshot, demand, demand_id, name, now)
            if not reason and signing and name in snapshot.nodes:
                reason = lacks_key(snapshot.nodes[name].view, signing) or ""
            if not reason and quotas:
                reason = over_quota(quotas, used, amounts) or ""
            if reason:
                failed[name] = reason
                scores.pop(name, None)
            else:
                failed.pop(name, None)
                scores[name] = score
                beat = beats[name]
                valid_until = min(valid_until, beat.renewed + beat.duration)
        return valid_until

    def answer(
        self, snapshot: Snapshot, demand: Demand, demand_id: int, name: str, now: float
    ) -> Answer:
        """(score, "", amounts) when the pod fits on the node, else (0, why not, nothing).

        The hot path of a filter over thousands of nodes: an unchanged node answers a demand
        it has seen from its memo."""
        node = snapshot.nodes.get(name)
        beat = snapshot.heartbeats.get(name)
        if (
            node is None
            or beat is None
            or now - beat.renewed > beat.duration
            or not node.view.offered
        ):
            return 0, unusable(snapshot, name, now) or "node is not usable", NOTHING
        answer = node.answers.get(demand_id)
        if answer is not None:
            return answer
        quick = quick_fit(demand, node.summary)
        if quick is not None:
            score, reason = quick
            # The quick path grants one slice and reserves no compute: the demand's floor.
            answer = (0, reason, NOTHING) if score < 0 else (score, "", floor_of(demand))
        else:
            try:
                found = self._plan(node, demand, demand_id)
            except ValueError as e:  # a request the allocator refuses (a container's name)
                found = Unfit(f"failed to plan the pod: {e}")
            if isinstance(found, Unfit):
                answer = (0, found.reason, NOTHING)
            else:
                answer = (found.score, "", plan_amounts(found))
        if len(node.answers) > _ANSWERS:
            node.answers.clear()
        node.answers[demand_id] = answer
        return answer

    # --- plans ---------------------------------------------------------------------------

    def _plan(self, node: NodeSnapshot, demand: Demand, demand_id: int) -> Plan | Unfit:
        key = (node.shape_id, demand_id)
        found = self._plans.get(key)
        if found is None:
            found = planner.plan(demand, node.view.devices, node.usage, self.db)
            self._plans[key] = found
            if len(self._plans) > _PLANS:
                with contextlib.suppress(KeyError):  # another thread emptied it meanwhile
                    self._plans.popitem(last=False)
        return found

    def _bulkreason_of(self, node: NodeSnapshot, demand: Demand, demand_id: int) -> str | None:
        """The allocator's reason for the bulk path; None (decide the node by itself) when it
        cannot word one: a container name `Request` refuses must not fail the whole filter."""
        try:
            return reason_of(self._plan(node, demand, demand_id))
        except ValueError:
            return None

    def plan(self, snapshot: Snapshot, demand: Demand, name: str) -> Plan | Unfit:
        """The allocator's answer for the pod on this node (cached per shape)."""
        why = unusable(snapshot, name, time.monotonic())
        if why is not None:
            return Unfit(why)
        return self._plan(snapshot.nodes[name], demand, self.demand_id(demand))

    def fresh_plan(self, snapshot: Snapshot, demand: Demand, name: str) -> Plan | Unfit:
        """The same, decided anew: what bind trusts."""
        why = unusable(snapshot, name, time.monotonic())
        if why is not None:
            return Unfit(why)
        node = snapshot.nodes[name]
        return planner.plan(demand, node.view.devices, node.usage, self.db)

    # --- prioritize ----------------------------------------------------------------------

    def prioritize(
        self,
        uid: str,
        demand: Demand | None,
        names: Sequence[str],
        snapshot: Callable[[], Snapshot],
    ) -> list[tuple[str, int]]:
        """A 0..10 score per node: the pod's filter scores, else a plan on `snapshot()`
        (taken only when a node was not in that filter)."""
        last_uid, known = self._last
        if last_uid != uid:
            known = {}
        filtered = list(map(known.get, names))
        if None not in filtered:  # the names the filter passed, as kube-scheduler sends them
            return list(zip(names, cast("list[int]", filtered), strict=True))
        taken: Snapshot | None = None
        scores = []
        for name in names:
            score = known.get(name)
            if score is None and demand is not None:
                taken = taken or snapshot()
                found = self.plan(taken, demand, name)
                score = found.score if isinstance(found, Plan) else 0
            scores.append((name, score or 0))
        return scores
