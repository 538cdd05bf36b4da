"""The watchdog's metric families, as plain data for whichever endpoint renders them.

Per container and device (the honest measure of isolation): bytes the driver reports
(`hcs_container_vram_used_bytes`), bytes granted, bytes libhcs accounted (absent when unknown):
used well above accounted means the workload escaped libhcs. Per device: the vendor's total and
what processes of no known container hold. Counters: violations by action, polls, reader
errors; and the last poll's wall and CPU time, so the watchdog's own cost is visible.
"""

from __future__ import annotations

from dataclasses import dataclass

from hcsd.watchdog.watchdog import Watchdog

__all__ = ["Family", "families"]

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    kind: str  # "gauge" or "counter"
    doc: str
    samples: list[tuple[Labels, float]]


def families(watchdog: Watchdog) -> list[Family]:
    last = watchdog.last
    containers = last.assessment.containers if last else []
    devices = last.assessment.devices if last else []
    per_container: list[tuple[Labels, float]] = []
    granted: list[tuple[Labels, float]] = []
    accounted: list[tuple[Labels, float]] = []
    for usage in containers:
        allocation = usage.allocation
        labels = (
            ("container_id", allocation.container_id),
            ("namespace", allocation.pod.namespace),
            ("pod", allocation.pod.name),
            ("container", allocation.container_name),
            ("device", usage.device_uuid),
        )
        per_container.append((labels, usage.used_bytes))
        granted.append((labels, usage.granted_bytes))
        if usage.accounted_bytes is not None:
            accounted.append((labels, usage.accounted_bytes))
    strays: dict[str, int] = {d.device_uuid: 0 for d in devices if d.per_process}
    for stray in last.assessment.strays if last else []:
        strays[stray.device_uuid] = strays.get(stray.device_uuid, 0) + stray.used_bytes
    actions = {"warned": 0, "killed": 0, "kill_failed": 0} | dict(watchdog.actions)
    return [
        Family(
            "hcs_container_vram_used_bytes",
            "gauge",
            "Device memory the vendor's driver reports for a container's processes.",
            per_container,
        ),
        Family(
            "hcs_container_vram_granted_bytes",
            "gauge",
            "Device memory the container was granted on the device.",
            granted,
        ),
        Family(
            "hcs_container_vram_accounted_bytes",
            "gauge",
            "Device memory libhcs accounted for the container (absent when unknown).",
            accounted,
        ),
        Family(
            "hcs_device_vram_used_bytes",
            "gauge",
            "Device memory in use on the device, as its vendor reports it.",
            [((("device", d.device_uuid),), d.used_bytes) for d in devices],
        ),
        Family(
            "hcs_device_vram_unattributed_bytes",
            "gauge",
            "Device memory held by processes of no container with a grant.",
            [((("device", uuid),), value) for uuid, value in sorted(strays.items())],
        ),
        Family(
            "hcs_vram_violations_total",
            "counter",
            "Containers found over their grant, by the action taken.",
            [((("action", a),), n) for a, n in sorted(actions.items())],
        ),
        Family("hcs_watchdog_polls_total", "counter", "Watchdog polls.", [((), watchdog.polls)]),
        Family(
            "hcs_watchdog_reader_errors_total",
            "counter",
            "Polls in which a vendor reader failed.",
            [((("reader", r.name),), watchdog.reader_errors[r.name]) for r in watchdog.readers],
        ),
        Family(
            "hcs_watchdog_poll_seconds",
            "gauge",
            "Wall time of the last poll.",
            [((), last.seconds)] if last else [],
        ),
        Family(
            "hcs_watchdog_poll_cpu_seconds",
            "gauge",
            "CPU time of the last poll.",
            [((), last.cpu_seconds)] if last else [],
        ),
    ]
