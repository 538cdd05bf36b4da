"""The VRAM watchdog: poll the vendors, charge processes to containers, act on overruns.

Every `interval` seconds: each reader lists device memory per process; each process is charged
to the container its cgroup names (the outermost id holding a grant); each container's total
per device is compared with its grant plus the tolerance (`assessment`). A container over the
line is logged (`ns/pod/container: …`), counted, published as a `VramViolation` event, and
under the `kill` policy every process of it gets SIGKILL (`killing`). Processes of no known
container are logged once each and shown per device in the metrics.

The blocking part of a poll (vendor calls, /proc and sysfs reads, kills) runs in a worker
thread with a snapshot of the allocations taken on the event loop; events are published back
on the loop, so the service is only ever touched from the loop. Everything the watchdog needs
comes in through its constructor, so it runs the same in hcsd, in tests and in the benchmark.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hcsd.model import Allocation, FrontEnd, VramViolation
from hcsd.quantity import format_bytes
from hcsd.watchdog.assessment import Assessment, Attributed, ContainerUsage, Tolerance, assess
from hcsd.watchdog.cgroups import CgroupMapper, owner
from hcsd.watchdog.killing import Killer, KillReport
from hcsd.watchdog.usage import ReaderError, Sample, UsageReader

__all__ = ["Policy", "PollResult", "Watchdog", "WatchdogSettings"]

log = logging.getLogger(__name__)


class Policy(enum.StrEnum):
    WARN = "warn"  # log, count, publish
    KILL = "kill"  # and SIGKILL every process of the container


@dataclass(frozen=True, slots=True)
class WatchdogSettings:
    """What a poll needs; the daemon derives it from `[watchdog]` (WatchdogSection)."""

    interval: float
    tolerance: Tolerance
    policy: Policy


@dataclass(slots=True)
class PollResult:
    assessment: Assessment
    events: list[VramViolation]
    finished: float  # the watchdog clock when the poll ended
    seconds: float  # wall time of the poll
    cpu_seconds: float  # CPU time of the poll's thread


class Watchdog:
    def __init__(
        self,
        readers: Sequence[UsageReader],
        allocations: Callable[[], Sequence[Allocation]],
        publish: Callable[[VramViolation], None],
        settings: WatchdogSettings,
        *,
        mapper: CgroupMapper | None = None,
        killer: Killer | None = None,
        accounted: Callable[[Allocation], Mapping[str, int] | None] | None = None,
        members: Callable[[], Mapping[str, str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`members`: the containers of DRA claims, container id -> the claim's ledger key
        (a claim's allocation names no container; hcsd's NRI plugin links them)."""
        self.readers = list(readers)
        self.allocations = allocations
        self.publish = publish
        self.settings = settings
        self.mapper = mapper or CgroupMapper()
        self.killer = killer or Killer(self.mapper)
        self.accounted = accounted
        self.members = members or (lambda: {})
        self.clock = clock
        self.last: PollResult | None = None
        self.polls = 0
        self.actions: Counter[str] = Counter()  # violations by action
        self.reader_errors: Counter[str] = Counter()
        self._over: set[tuple[str, str]] = set()
        self._devices_over: set[str] = set()
        self._strays: set[tuple[str, int]] = set()
        self._failing: set[str] = set()

    # -- running ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Poll every `interval` seconds until cancelled."""
        log.info(
            "vram watchdog: every %gs, policy %s, readers %s",
            self.settings.interval,
            self.settings.policy.value,
            ", ".join(r.name for r in self.readers) or "none",
        )
        while True:
            started = self.clock()
            result = await asyncio.to_thread(
                self.observe, list(self.allocations()), dict(self.members())
            )
            self.report(result)
            await asyncio.sleep(max(0.0, self.settings.interval - (self.clock() - started)))

    def poll(self) -> PollResult:
        """One whole poll on the calling thread (tests and the benchmark)."""
        result = self.observe(list(self.allocations()), dict(self.members()))
        self.report(result)
        return result

    def report(self, result: PollResult) -> None:
        """Publish a poll's events; called on the thread that owns the service."""
        self.last = result
        self.polls += 1
        for event in result.events:
            self.actions[event.action] += 1
            self.publish(event)

    def close(self) -> None:
        for reader in self.readers:
            try:
                reader.close()
            except Exception as e:  # shutdown goes on whatever a vendor library raises
                log.debug("vram watchdog: closing %s: %s", reader.name, e)

    # -- one poll ----------------------------------------------------------------------------

    def observe(
        self, allocations: Sequence[Allocation], members: Mapping[str, str] | None = None
    ) -> PollResult:
        """Read, charge, judge and (under `kill`) act; safe to run in a worker thread."""
        members = members or {}
        started, cpu = time.perf_counter(), time.thread_time()
        sample = self._read()
        attributed = [Attributed(p, self.mapper.ids(p.pid)) for p in sample.processes]
        assessment = assess(
            attributed,
            allocations,
            totals={t.device_uuid: t.used_bytes for t in sample.totals},
            per_process=sample.per_process,
            tolerance=self.settings.tolerance,
            accounted=self.accounted,
            members=members,
        )
        events = self._enforce(assessment, {a.container_id for a in allocations}, members)
        self._note_strays(assessment)
        self._note_devices(assessment)
        return PollResult(
            assessment,
            events,
            finished=self.clock(),
            seconds=time.perf_counter() - started,
            cpu_seconds=time.thread_time() - cpu,
        )

    def _read(self) -> Sample:
        merged = Sample()
        for reader in self.readers:
            try:
                sample = reader.read()
            except ReaderError as e:
                self.reader_errors[reader.name] += 1
                if reader.name not in self._failing:
                    self._failing.add(reader.name)
                    log.warning("vram watchdog: %s: %s (retrying every poll)", reader.name, e)
                continue
            if reader.name in self._failing:
                self._failing.discard(reader.name)
                log.info("vram watchdog: %s answers again", reader.name)
            merged.processes += sample.processes
            merged.totals += sample.totals
            merged.per_process |= sample.per_process
            merged.unmeasured += sample.unmeasured
        return merged

    def _enforce(
        self, assessment: Assessment, held: set[str], members: Mapping[str, str]
    ) -> list[VramViolation]:
        over = assessment.violations
        now = {(u.allocation.container_id, u.device_uuid) for u in over}
        for container, device in sorted(self._over - now):
            log.info("%s: back within its grant on %s", container, device)
        fresh = [u for u in over if (u.allocation.container_id, u.device_uuid) not in self._over]
        self._over = now
        if self.settings.policy is Policy.WARN:
            for usage in fresh:
                log.warning("%s; policy warn: not killed", _describe(usage))
            return [_event(u, "warned") for u in fresh]
        events = []
        by_container: dict[str, list[ContainerUsage]] = {}
        for usage in over:
            by_container.setdefault(usage.allocation.container_id, []).append(usage)
        for container, usages in by_container.items():
            seeds = sorted({pid for u in usages for pid in u.pids})
            report = self._kill(container, seeds, held, members)
            action = "killed" if report.killed else "kill_failed"
            if not report.killed and all(u not in fresh for u in usages):
                # Killed at an earlier poll; the driver is still tearing the processes down.
                log.debug("%s: over its grant while its processes exit", container)
                continue
            for usage in usages:
                log.warning(
                    "%s; policy kill: %s",
                    _describe(usage),
                    f"SIGKILL sent to {len(report.killed)} process(es) "
                    f"({_pids(report.killed)}, found through {report.source})"
                    if report.killed
                    else "no process of it could be signalled (all gone?)",
                )
                events.append(_event(usage, action))
        return events

    def _kill(
        self, holder: str, seeds: Sequence[int], held: set[str], members: Mapping[str, str]
    ) -> KillReport:
        """Kill the holder's container, or each container of a claim that has a process on
        the device (a claim's other containers keep running: they hold no device memory)."""
        belongs = self._membership(holder, held, members)
        targets = sorted(c for c, key in members.items() if key == holder)
        if not targets:
            return self.killer.kill(holder, seeds, belongs)
        by_container: dict[str, list[int]] = {}
        for pid in seeds:
            ids = self.mapper.ids(pid) or ()
            target = next((i for i in ids if members.get(i) == holder), None)
            if target is not None:
                by_container.setdefault(target, []).append(pid)
        reports = [self.killer.kill(c, p, belongs) for c, p in sorted(by_container.items())]
        killed = tuple(pid for r in reports for pid in r.killed)
        return KillReport(killed, reports[0].source if reports else "cgroup")

    def _membership(
        self, holder: str, held: set[str], members: Mapping[str, str]
    ) -> Callable[[int], bool]:
        """Whether a pid is charged to `holder` now, by the rule that charged it."""

        def belongs(pid: int) -> bool:
            ids = self.mapper.ids(pid)
            return ids is not None and owner(ids, held, members) == holder

        return belongs

    def _note_strays(self, assessment: Assessment) -> None:
        seen = set()
        for stray in assessment.strays:
            key = (stray.device_uuid, stray.pid)
            seen.add(key)
            if key not in self._strays:
                whose = (
                    f"container {stray.container_id[:12]} holds no grant"
                    if stray.container_id
                    else "in no container"
                )
                log.warning(
                    "vram watchdog: %s: pid %d (%s) holds %s",
                    stray.device_uuid,
                    stray.pid,
                    whose,
                    format_bytes(stray.used_bytes),
                )
        self._strays = seen

    def _note_devices(self, assessment: Assessment) -> None:
        """Devices watched on their totals only: warn when the total passes the grants."""
        over = {d.device_uuid for d in assessment.devices if d.over and not d.per_process}
        for device in assessment.devices:
            if device.device_uuid in over - self._devices_over:
                log.warning(
                    "vram watchdog: %s: %s in use, grants %s (allowed %s); its vendor lists no "
                    "processes, so no container can be blamed",
                    device.device_uuid,
                    format_bytes(device.used_bytes),
                    format_bytes(device.granted_bytes),
                    format_bytes(device.allowed_bytes),
                )
        self._devices_over = over


def who(allocation: Allocation) -> str:
    """`ns/pod/container` for Kubernetes containers, the id for the rest (log convention)."""
    if allocation.front_end is FrontEnd.DRA:
        return f"claim {allocation.pod.namespace}/{allocation.pod.name} ({allocation.container_id})"
    if allocation.pod.name:
        return f"{allocation.pod}/{allocation.container_name or allocation.container_id[:12]}"
    return allocation.container_id


def _describe(usage: ContainerUsage) -> str:
    grant = (
        f"granted {format_bytes(usage.granted_bytes)}"
        if usage.granted_bytes
        else "granted nothing there"
    )
    text = (
        f"{who(usage.allocation)}: holds {format_bytes(usage.used_bytes)} of device memory on "
        f"{usage.device_uuid}, {grant} (allowed {format_bytes(usage.allowed_bytes)} with the "
        f"tolerance) in pid(s) {_pids(usage.pids)}"
    )
    if usage.accounted_bytes is None:
        return text + "; libhcs accounted: unknown"
    gap = usage.used_bytes - usage.accounted_bytes
    text += f"; libhcs accounted {format_bytes(usage.accounted_bytes)}"
    if gap > usage.allowed_bytes - usage.granted_bytes:
        text += f": {format_bytes(gap)} escaped libhcs"
    return text


def _pids(pids: Sequence[int]) -> str:
    shown = ", ".join(str(p) for p in pids[:8])
    return shown + (f" and {len(pids) - 8} more" if len(pids) > 8 else "")


def _event(usage: ContainerUsage, action: str) -> VramViolation:
    allocation = usage.allocation
    return VramViolation(
        container_id=allocation.container_id,
        device_uuid=usage.device_uuid,
        used_bytes=usage.used_bytes,
        granted_bytes=usage.granted_bytes,
        allowed_bytes=usage.allowed_bytes,
        accounted_bytes=-1 if usage.accounted_bytes is None else usage.accounted_bytes,
        pids=usage.pids,
        action=action,
        pod=allocation.pod,
        container_name=allocation.container_name,
    )
