"""Keeping the pods of one job on one fabric domain: a filter rule and a prioritize rule.

The job's domain is the fabric domain (ComputeNode spec.fabric.domain) where most of its pods
hold accelerators now (`JobIndex`, fed by the pods informer and by this extender's own binds);
before any of them does, the domain chosen for it, from the whole fleet (`DomainIndex`), not
from the nodes kube-scheduler offers (at 5,000 nodes it offers a sample):

- with `hcs.io/job-size` (pods in the job): the smallest domain whose room, less the room
  promised to other jobs' choices, takes the pods of the job not placed yet; the domain with the
  most such room when none does;
- without it: the domain with the most room left (then the most nodes, then the first name).

Room is counted in pods like this one (`DomainIndex.rooms`); a choice promises the room of the
job's pods not placed yet (its size, else the pods of it seen pending). A choice lives
`CHOICE_SECONDS` after the job's last pod was seen; most are replaced sooner by where the pods
actually went.

- **prioritize** (every pod of a job, when the offered nodes span two domains or more; "no
  domain" counts as one): a node in the job's domain scores 6..10 (6 + 4/10 of its node score),
  any other 0..5 (half its node score). Otherwise the scores are returned as they are.
- **filter** (only with `hcs.io/topology-preference: high-bandwidth`): the job's domain is
  decided here (a first pod included), and the nodes outside it are refused as unresolvable
  (preempting pods there would not help), with one reason string per domain.

Which devices a pod gets inside its node is not touched: that is the planner's choice.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hcsd.cluster.demand import Demand
from hcsd.cluster.fabric_index import DomainIndex
from hcsd.cluster.fabric_jobs import JOB_SIZE_MAX, JobIndex, JobKey, job_of, job_size
from hcsd.cluster.state import Snapshot
from hcsd.contract.names import ANNOTATION_TOPOLOGY
from hcsd.model import TopologyPreference

__all__ = ["CHOICE_SECONDS", "FabricPlacement", "lift"]

CHOICE_SECONDS = 30.0
CHOICES = 10_000  # jobs whose choice is remembered at most (the oldest seen goes first)
_INSIDE = tuple(6 + s * 4 // 10 for s in range(11))
_OUTSIDE = tuple(s * 5 // 10 for s in range(11))


def lift(score: int, in_domain: bool) -> int:
    """A node's 0..10 score with the job's fabric domain first: 6..10 inside, 0..5 outside."""
    score = min(max(score, 0), 10)
    return _INSIDE[score] if in_domain else _OUTSIDE[score]


@dataclass(slots=True)
class _Choice:
    domain: str
    size: int  # hcs.io/job-size; 0: not said
    until: float
    pending: set[str] = field(default_factory=set)  # pod uids seen deciding, not placed
    promised: int = 0  # what it counts in FabricPlacement._promised[domain]


class FabricPlacement:
    def __init__(
        self,
        jobs: JobIndex,
        changed_between: Callable[[int, int], set[str] | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.jobs = jobs
        self.index = DomainIndex(changed_between)
        self.clock = clock
        self._lock = threading.Lock()
        self._chosen: OrderedDict[JobKey, _Choice] = OrderedDict()  # oldest seen first
        self._promised: Counter[str] = Counter()  # domain -> pods' room the choices promise
        self._reasons: dict[tuple[str, str], str] = {}  # (node's domain, job's) -> reason

    # --- the job's domain -------------------------------------------------------------------

    def _placed_domain(self, job: JobKey) -> str:
        """Where most of the job's placed pods are (ties: the first name), else ""."""
        counts: Counter[str] = Counter()
        domain_of = self.index.domain_of
        for name, pods in self.jobs.nodes_of(job).items():
            domain = domain_of.get(name, "")
            if domain:
                counts[domain] += pods
        return min(counts, key=lambda d: (-counts[d], d)) if counts else ""

    def _need(self, job: JobKey, choice: _Choice) -> int:
        """Under the lock: pods of the job not placed yet: its size less those placed, or at
        least the pods of it seen deciding that are not placed (those placed are forgotten
        here). Takes `JobIndex`'s lock inside this one (never the other way round)."""
        choice.pending = self.jobs.unplaced(choice.pending)
        return max(choice.size - self.jobs.placed(job), len(choice.pending))

    def _promise(self, choice: _Choice, amount: int) -> None:
        """Under the lock: the choice now promises `amount` pods' room in its domain."""
        self._promised[choice.domain] += amount - choice.promised
        choice.promised = amount

    def _expire(self, now: float) -> None:
        """Under the lock: drop the choices past their time (the oldest seen come first)."""
        while self._chosen:
            job, choice = next(iter(self._chosen.items()))
            if choice.until > now:
                return
            self._promise(choice, 0)
            del self._chosen[job]

    def domain_for(self, pod: Mapping[str, Any], job: JobKey, demand: Demand,
                   snapshot: Snapshot) -> str:  # fmt: skip
        """The job's domain (choosing it when the job has none yet), noting the pod as one of
        the job's; "" when no node reports a domain."""
        self.index.sync(snapshot)
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        now = self.clock()
        placed = self._placed_domain(job)
        with self._lock:
            self._expire(now)
            choice = self._chosen.get(job)
            if choice is not None:
                choice.until = now + CHOICE_SECONDS
                choice.size = job_size(pod) or choice.size
                if len(choice.pending) < JOB_SIZE_MAX:
                    choice.pending.add(uid)
                self._chosen.move_to_end(job)
                self._promise(choice, self._need(job, choice))
        if choice is not None:
            return placed or choice.domain
        choice = _Choice(placed, job_size(pod), now + CHOICE_SECONDS, {uid})
        if not placed:
            choice.domain = self._choose(job, choice, demand, snapshot)
        if choice.domain:
            with self._lock:
                raced = self._chosen.pop(job, None)  # another thread chose meanwhile
                if raced is not None:
                    self._promise(raced, 0)
                self._chosen[job] = choice
                self._promise(choice, self._need(job, choice))
                while len(self._chosen) > CHOICES:
                    self._promise(self._chosen.popitem(last=False)[1], 0)
        return choice.domain

    def _choose(self, job: JobKey, choice: _Choice, demand: Demand, snapshot: Snapshot) -> str:
        """The domain for a job that has none: see the module's docstring."""
        rooms = self.index.rooms(snapshot, demand)
        if not rooms:
            return ""
        with self._lock:
            free = {d: room - self._promised[d] for d, room in rooms.items()}
            need = self._need(job, choice)
        if choice.size:
            fits = [d for d in free if free[d] >= need]
            if fits:
                return min(fits, key=lambda d: (free[d], d))
        members = self.index.members
        return min(free, key=lambda d: (-free[d], -len(members.get(d, ())), d))

    # --- the two verbs ----------------------------------------------------------------------

    def filter(self, pod: Mapping[str, Any], demand: Demand, snapshot: Snapshot,
               passed: Sequence[str]) -> tuple[list[str], dict[str, str]]:  # fmt: skip
        """(`passed` less the nodes outside the job's domain, those nodes with why) when the pod
        asks for high bandwidth; else (`passed`, nothing)."""
        if demand.topology is not TopologyPreference.HIGH_BANDWIDTH:
            return list(passed), {}
        job = job_of(pod)
        domain = self.domain_for(pod, job, demand, snapshot) if job is not None else ""
        if not domain:
            return list(passed), {}
        members = self.index.members
        inside = members.get(domain, frozenset())
        keep = list(filter(inside.__contains__, passed))
        if len(keep) == len(passed):
            return keep, {}
        rest = set(passed).difference(inside)
        refused: dict[str, str] = {}
        for here, names in members.items():  # per domain, in C: a fleet has a few domains
            if here != domain and not names.isdisjoint(rest):
                found = rest.intersection(names)
                refused.update(dict.fromkeys(found, self._reason(here, domain)))
                rest -= found
        refused.update(dict.fromkeys(rest, self._reason("", domain)))  # no domain reported
        return keep, refused

    def _reason(self, here: str, domain: str) -> str:
        """One string per (node's domain, job's domain): short, bounded (domains are at most
        64 characters), and equal across nodes so kube-scheduler's summary counts them."""
        reason = self._reasons.get((here, domain))
        if reason is None:
            where = f"node in fabric domain {here}" if here else "node reports no fabric domain"
            reason = f"{where}; the job's is {domain} ({ANNOTATION_TOPOLOGY}: high-bandwidth)"
            if len(self._reasons) > 4096:
                self._reasons = {}
            self._reasons[(here, domain)] = reason
        return reason

    def prioritize(self, pod: Mapping[str, Any], demand: Demand,
                   snapshot: Callable[[], Snapshot],
                   scores: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:  # fmt: skip
        """`scores` with the job's fabric domain first (`lift`); as they are for a pod of no
        job, or when the offered nodes are all in one domain (or none)."""
        job = job_of(pod)
        if job is None or len(scores) < 2:
            return list(scores)
        self.index.sync(snapshot())
        names = [name for name, _ in scores]
        members = self.index.members
        first = members.get(self.index.domain_of.get(names[0], ""))
        if first is not None:
            if first.issuperset(names):
                return list(scores)
        elif all(m.isdisjoint(names) for m in members.values()):
            return list(scores)  # no node offered reports a domain
        domain = self.domain_for(pod, job, demand, snapshot())
        inside = members.get(domain, frozenset())
        try:  # a plain comprehension: this runs over every node offered
            return [
                (name, _INSIDE[score]) if name in inside else (name, _OUTSIDE[score])
                for name, score in scores
            ]
        except IndexError:  # a score outside 0..10 (not the decider's): the careful way
            return [(name, lift(score, name in inside)) for name, score in scores]
