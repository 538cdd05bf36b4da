"""Each container's real device memory against its grant: the watchdog's judgement, pure.

Input: the processes the vendors listed, each with the container ids its cgroup names; the
ledger's allocations; the vendors' device totals. Output: per container and device, what the
driver says it holds, what it was granted, the line it may not cross (grant + tolerance), what
libhcs accounted; processes of no container that holds a grant ("strays"); and per device, the
total in use against the sum of grants, the only check possible where a vendor lists no
processes.

The tolerance has two parts because the driver counts more than libhcs can: a share of the
grant (allocator rounding, libraries' pools) and a fixed amount per process: the CUDA context
and the modules loaded into it, which no allocation call returns and so no preload library can
charge. Measured with NVML on an H100 (driver 580): a bare context 518Mi, a PyTorch process
586Mi beyond what its allocator reserved, 1.7Gi with CUDA_MODULE_LOADING=EAGER. The default
1Gi per process covers lazy loading (CUDA 12's default) with room to spare.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hcsd.model import Allocation
from hcsd.watchdog.cgroups import owner
from hcsd.watchdog.usage import ProcessUsage

__all__ = [
    "Assessment",
    "Attributed",
    "ContainerUsage",
    "DeviceUsage",
    "Stray",
    "Tolerance",
    "assess",
]


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How far past its grant a container may go (`[watchdog]` sets both)."""

    percent: float
    per_process_bytes: int

    def allowed(self, granted: int, processes: int) -> int:
        return granted + int(granted * self.percent / 100) + self.per_process_bytes * processes


@dataclass(frozen=True, slots=True)
class Attributed:
    """A process's usage and the container ids its cgroup names (None: it has exited)."""

    usage: ProcessUsage
    ids: tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    allocation: Allocation
    device_uuid: str
    used_bytes: int
    granted_bytes: int  # 0: the container uses a device it was not given
    allowed_bytes: int
    pids: tuple[int, ...]
    accounted_bytes: int | None  # libhcs's figure; None when unknown

    @property
    def over(self) -> bool:
        return self.used_bytes > self.allowed_bytes


@dataclass(frozen=True, slots=True)
class Stray:
    """Device memory held by a process of no container with a grant."""

    device_uuid: str
    pid: int
    used_bytes: int
    container_id: str  # the id its cgroup names, "" for a host process


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    device_uuid: str
    used_bytes: int  # the vendor's total for the device
    granted_bytes: int
    allowed_bytes: int
    per_process: bool  # whether processes were listed too (else this is the only check)

    @property
    def over(self) -> bool:
        return self.used_bytes > self.allowed_bytes


@dataclass(slots=True)
class Assessment:
    containers: list[ContainerUsage] = field(default_factory=list)
    strays: list[Stray] = field(default_factory=list)
    devices: list[DeviceUsage] = field(default_factory=list)

    @property
    def violations(self) -> list[ContainerUsage]:
        return [c for c in self.containers if c.over]


def assess(
    processes: Iterable[Attributed],
    allocations: Sequence[Allocation],
    *,
    totals: Mapping[str, int],
    per_process: Collection[str],
    tolerance: Tolerance,
    accounted: Callable[[Allocation], Mapping[str, int] | None] | None = None,
    members: Mapping[str, str] | None = None,
) -> Assessment:
    """`members`: the containers of DRA claims (container id -> the claim's key): their
    processes are charged to the claim, which all its containers share."""
    held = {a.container_id: a for a in allocations}
    used: dict[tuple[str, str], int] = {}
    pids: dict[tuple[str, str], list[int]] = {}
    result = Assessment()
    for process in processes:
        usage = process.usage
        if process.ids is None or usage.device_uuid not in per_process:
            continue  # exited since it was listed, or a device judged on its total only
        container = owner(process.ids, held, members)
        if container is None:
            stray_id = process.ids[-1] if process.ids else ""
            result.strays.append(Stray(usage.device_uuid, usage.pid, usage.used_bytes, stray_id))
            continue
        key = (container, usage.device_uuid)
        used[key] = used.get(key, 0) + usage.used_bytes
        pids.setdefault(key, []).append(usage.pid)
    for allocation in allocations:
        grants = {g.device_uuid: g.vram_bytes for g in allocation.grants}
        devices = [d for d in grants if d in per_process]
        devices += sorted(d for c, d in used if c == allocation.container_id and d not in grants)
        if not devices:
            continue
        libhcs = accounted(allocation) if accounted is not None else None
        for device in devices:
            key = (allocation.container_id, device)
            granted, listed = grants.get(device, 0), tuple(sorted(pids.get(key, ())))
            result.containers.append(
                ContainerUsage(
                    allocation=allocation,
                    device_uuid=device,
                    used_bytes=used.get(key, 0),
                    granted_bytes=granted,
                    allowed_bytes=tolerance.allowed(granted, len(listed)),
                    pids=listed,
                    accounted_bytes=None if libhcs is None else libhcs.get(device),
                )
            )
    result.devices = _devices(allocations, totals, per_process, tolerance)
    return result


def _devices(
    allocations: Sequence[Allocation],
    totals: Mapping[str, int],
    per_process: Collection[str],
    tolerance: Tolerance,
) -> list[DeviceUsage]:
    """Totals against the sum of grants; one process's allowance per holder plus one for the
    driver's own reservations (coarse: the per-process check is the precise one)."""
    granted: dict[str, int] = {}
    holders: dict[str, int] = {}
    for allocation in allocations:
        for grant in allocation.grants:
            granted[grant.device_uuid] = granted.get(grant.device_uuid, 0) + grant.vram_bytes
            holders[grant.device_uuid] = holders.get(grant.device_uuid, 0) + 1
    return [
        DeviceUsage(
            device_uuid=uuid,
            used_bytes=total,
            granted_bytes=granted.get(uuid, 0),
            allowed_bytes=tolerance.allowed(granted.get(uuid, 0), holders.get(uuid, 0) + 1),
            per_process=uuid in per_process,
        )
        for uuid, total in sorted(totals.items())
    ]
