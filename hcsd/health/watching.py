"""Health watching: pick the best source that works here, feed the analyzer, apply its verdicts.

Sources are tried in order (eBPF via libbpf, then bcc, then polling /dev/kmsg); the first that
starts wins, and each one that cannot start says why in one log line. PCIe AER counters in sysfs
are polled as well unless the eBPF source has the AER tracepoint. Sub-health signals (a slow
or down-trained device, subhealth.py) are checked on the same poll; a device the fault analyzer
finds healthy but a signal has held degraded is `degraded` with the signal's reason. Verdicts go
to the node service as device records, so the allocator, the API watch and the metrics all see
them at once.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from hcsd.contract.names import SUBHEALTH_ATTRIBUTE, SUBHEALTH_NODE_ATTRIBUTE
from hcsd.discovery import DiscoveryBackend
from hcsd.health.analyzer import HealthAnalyzer
from hcsd.health.events import HealthEvent
from hcsd.health.settings import HealthSection
from hcsd.health.signals import Signal
from hcsd.health.sources.aer import AerPoller
from hcsd.health.sources.base import HealthSource, SourceUnavailable
from hcsd.health.sources.bcc import BccSource
from hcsd.health.sources.counters import CounterPoller
from hcsd.health.sources.ebpf import EbpfSource
from hcsd.health.sources.kmsg import KmsgSource
from hcsd.health.subhealth import SubHealth
from hcsd.model import HealthState
from hcsd.service import NodeService

__all__ = [
    "HEALTH_ATTRIBUTES",
    "SOURCE_ORDER",
    "SUBHEALTH_ATTRIBUTE",
    "SUBHEALTH_ATTRIBUTES",
    "HealthWatcher",
    "wanted",
]

log = logging.getLogger(__name__)

HEALTH_ATTRIBUTES = ("health_reason", "health_cause")  # set while a device is not healthy
SUBHEALTH_ATTRIBUTES = (SUBHEALTH_ATTRIBUTE, SUBHEALTH_NODE_ATTRIBUTE)  # set by sub-health
#: Sub-health tracker entries kept across a restart, in the run directory.
SUBHEALTH_STATE = "subhealth.json"

SOURCE_ORDER = ("ebpf", "bcc", "kmsg")


def wanted(settings: HealthSection) -> bool:
    """Whether hcsd watches health at all: health.source = off turns off the kernel event
    sources only; the vendor counters and sub-health still run unless health.subhealth is
    off too."""
    return settings.source != "off" or settings.subhealth


class HealthWatcher:
    def __init__(
        self,
        service: NodeService,
        settings: HealthSection,
        *,
        clock: Callable[[], float] = time.monotonic,
        backends: Sequence[DiscoveryBackend] = (),
        sysfs: str,
        kmsg_path: str = "/dev/kmsg",
        run_dir: str | None = None,
    ) -> None:
        self.service = service
        self.settings = settings
        self.rules = settings.line_rules()
        self.sysfs, self.kmsg_path = sysfs, kmsg_path
        uuids = [status.device.uuid for status in service.devices()]
        self.analyzer = HealthAnalyzer(settings.analyzer_settings(), clock, uuids)
        self.source: HealthSource | None = None
        self.source_name = "off"
        self.aer: AerPoller | None = None
        self.counters = (
            CounterPoller(backends, self._bus_of_uuid, interval=settings.aer_poll_interval)
            if backends
            else None
        )
        self.subhealth = (
            SubHealth(
                settings.subhealth_settings(),
                clock,
                sysfs=sysfs,
                state_path=os.path.join(run_dir, SUBHEALTH_STATE) if run_dir else None,
            )
            if settings.subhealth
            else None
        )
        self.events: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.unattributed = 0
        self.unavailable: dict[str, str] = {}
        self.node_wide: frozenset[str] = frozenset()  # clock reasons every device holds

    def _candidates(self) -> list[HealthSource]:
        s = self.settings
        make: dict[str, Callable[[], HealthSource]] = {
            "ebpf": lambda: EbpfSource(s.bpf_dir, self.rules),
            "bcc": lambda: BccSource(self.rules),
            "kmsg": lambda: KmsgSource(self.kmsg_path, self.rules),
        }
        names = SOURCE_ORDER if s.source == "auto" else (s.source,)
        return [make[name]() for name in names if name in make]

    def start(self, loop: asyncio.AbstractEventLoop) -> str:
        """Start the first source that works; returns its name ("polling" only if none)."""
        for candidate in self._candidates():
            try:
                candidate.start(loop, self.on_event)
            except SourceUnavailable as e:
                self.unavailable[candidate.name] = str(e)
                log.warning("health: %s source unavailable: %s", candidate.name, e)
                continue
            self.source, self.source_name = candidate, candidate.name
            break
        has_aer_tracepoint = isinstance(self.source, EbpfSource) and self.source.has_aer
        if self.settings.source != "off" and not has_aer_tracepoint:
            buses = [s.device.pci_bus_id for s in self.service.devices()]
            self.aer = AerPoller(buses, sysfs=self.sysfs, interval=self.settings.aer_poll_interval)
        if self.source is None:
            self.source_name = "polling" if (self.aer or self.counters) else "off"
        extras = [
            name
            for name, poller in (
                ("AER counters in sysfs", self.aer),
                ("vendor counters", self.counters),
            )
            if poller
        ]
        log.info(
            "health: watching with %s%s",
            self.source_name,
            "".join(f" + {e}" for e in extras) if self.source else "",
        )
        return self.source_name

    async def run(self) -> None:
        """Tick the analyzer (recovery over time) and poll AER counters until cancelled.

        `start` must have been called on this loop first (the daemon does so before READY=1,
        so that the status line names the active source).
        """
        loop = asyncio.get_running_loop()
        next_poll = 0.0
        try:
            while True:
                if loop.time() >= next_poll:
                    if self.aer is not None:
                        self.aer.poll(self.on_event)  # sysfs reads: quick, on the loop
                    if self.counters is not None:
                        await self.counters.poll(self.on_event)  # vendor calls: off the loop
                    self.check_subhealth()
                    next_poll = loop.time() + self.settings.aer_poll_interval
                self.tick()
                await asyncio.sleep(self.settings.tick_interval)
        finally:
            if self.source is not None:
                self.source.stop()
            if self.counters is not None:
                self.counters.close()

    def on_event(self, event: HealthEvent) -> None:
        self.events[(event.vendor, event.code, event.severity.name.lower())] += 1
        if not event.bus_id:
            return  # host-level (memory controller): counted, not a device's fault
        uuid = self._uuid_for_bus(event.bus_id)
        if uuid is None:
            self.unattributed += 1
            log.debug("health: %s on %s: not one of ours", event.code, event.bus_id)
            return
        before = self.analyzer.state(uuid)
        if self.subhealth is not None:
            self.subhealth.note(uuid, event)
        self.analyzer.observe(uuid, event)
        self._apply(uuid, event if self.analyzer.state(uuid) is not before else None)

    def tick(self) -> None:
        """Re-evaluate the analyzer (recovery with time) and apply the devices that changed."""
        for uuid in self.analyzer.tick():
            self._apply(uuid, None)

    def check_subhealth(self) -> None:
        """Read every device's sub-health signals (sysfs and the readings the vendor counters'
        poll brought) and apply the devices whose record disagrees with the tracker: held
        reasons changed, a node-wide reason came or went, or a record that never carried
        the verdict (a restart restored the holds, a device came back through hot-plug)."""
        if self.subhealth is None:
            return
        devices = [s.device for s in self.service.devices()]
        gauges = self.counters.gauges if self.counters is not None else {}
        self.subhealth.check(devices, gauges)
        present = [d.uuid for d in devices if d.health_state is not HealthState.LOST]
        self.node_wide = self.subhealth.node_wide(present)
        for device in devices:
            attributes = dict(device.attributes)
            shown = tuple(attributes.get(key, "") for key in SUBHEALTH_ATTRIBUTES)
            if device.uuid in present and shown != self._subhealth_words(device.uuid):
                self._apply(device.uuid, None)

    def _held(self, uuid: str) -> tuple[Signal, ...]:
        """The signals that degrade the device: its own, not the node-wide ones."""
        if self.subhealth is None:
            return ()
        return tuple(s for s in self.subhealth.held(uuid) if s.reason not in self.node_wide)

    def _subhealth_words(self, uuid: str) -> tuple[str, str]:
        """The `subhealth` and `subhealth_node` attributes the device should carry."""
        return ",".join(s.reason for s in self._held(uuid)), ",".join(sorted(self.node_wide))

    def _bus_of_uuid(self, uuid: str) -> str | None:
        device = self.service.device(uuid)
        return device.pci_bus_id if device is not None else None

    def _uuid_for_bus(self, bus_id: str) -> str | None:
        device = self.service.device_at_bus(bus_id)
        return device.uuid if device is not None else None

    def _apply(self, uuid: str, event: HealthEvent | None) -> None:
        status = self.service.device_status(uuid)
        if status is None or status.device.health_state is HealthState.LOST:
            return  # hot-plug owns lost devices
        state = self.analyzer.state(uuid)
        score = round(self.analyzer.score(uuid))
        device = status.device
        reason = self.analyzer.reason(uuid) or "quiet period passed"
        cause = self.analyzer.cause(uuid) or reason
        held = self._held(uuid)
        if held:
            # Sub-health degrades a device the analyzer finds healthy and lowers its score (the
            # extender's ranking); it never lifts a worse state.
            score = min(score, round(self.settings.subhealth_score))
            if state is HealthState.HEALTHY:
                state = HealthState.DEGRADED
                reason = "; ".join(f"{s.reason}: {s.detail}" for s in held)[:1024]
                cause = ",".join(s.reason for s in held)
        elif SUBHEALTH_ATTRIBUTE in dict(device.attributes) and state is HealthState.HEALTHY:
            reason = "sub-health signals cleared"
        # Why travels with the device while it is not healthy, one source for every reader:
        # `health_reason` in detail (`hcsctl devices --json`, the ComputeNode) and
        # `health_cause` in stable words (the hcs_device_health_reason label). A new kind of
        # fault is news even at the same state and score; the details of the same kind are
        # not (a pid per event would be a status write per event).
        attributes = tuple(
            (k, v)
            for k, v in device.attributes
            if k not in HEALTH_ATTRIBUTES and k not in SUBHEALTH_ATTRIBUTES
        )
        if state is not HealthState.HEALTHY:
            attributes += (("health_reason", reason), ("health_cause", cause))
        words, node_words = self._subhealth_words(uuid)
        if words:
            attributes += ((SUBHEALTH_ATTRIBUTE, words),)
        if node_words:
            attributes += ((SUBHEALTH_NODE_ATTRIBUTE, node_words),)
        new, old = dict(attributes), dict(device.attributes)
        same_cause = all(
            new.get(key) == old.get(key)
            for key in ("health_cause", SUBHEALTH_ATTRIBUTE, SUBHEALTH_NODE_ATTRIBUTE)
        )
        if device.health_state is state and abs(device.health_score - score) < 5 and same_cause:
            return  # no news: keep the API watch quiet
        self.service.set_device(
            replace(device, health_state=state, health_score=score, attributes=attributes)
        )
        if device.health_state is not state:
            log.warning(
                "health: device %s (%s) %s -> %s: %s",
                uuid,
                device.pci_bus_id,
                device.health_state.value,
                state.value,
                reason,
            )
            if not state.schedulable:
                for allocation in self.service.holders(uuid):
                    who = (
                        f"{allocation.pod}/{allocation.container_name}"
                        if allocation.pod.name
                        else allocation.container_id
                    )
                    log.warning("%s: runs on %s device %s", who, state.value, uuid)

    def stats(self) -> dict[str, int]:
        counts = dict(self.source.stats()) if self.source is not None else {}
        counts["unattributed"] = self.unattributed
        return counts
