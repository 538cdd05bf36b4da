"""The one vocabulary of HCS: devices, their links, allocations and requests.

Every other part (discovery, ledger, allocator, API, cluster side) speaks in these types, so
they hold plain values only: no I/O, no behaviour that needs a running node.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = [
    "Acceptance",
    "Allocation",
    "Device",
    "DeviceNode",
    "FrontEnd",
    "Grant",
    "HealthState",
    "Link",
    "LinkKind",
    "NodeMode",
    "PodRef",
    "Request",
    "SpreadPolicy",
    "TopologyPreference",
    "Vendor",
    "VramViolation",
]


class Vendor(enum.StrEnum):
    """Accelerator vendors HCS knows, named as users write them in `hcs.io/vendors`."""

    NVIDIA = "nvidia"
    ASCEND = "ascend"
    HYGON = "hygon"
    CAMBRICON = "cambricon"

    @classmethod
    def parse(cls, text: str) -> Vendor:
        try:
            return cls(text.strip().lower())
        except ValueError:
            known = ", ".join(v.value for v in cls)
            raise ValueError(f"unknown vendor {text!r}: expected one of {known}") from None


class HealthState(enum.StrEnum):
    """Health as the allocator and the scheduler act on it.

    DEGRADED (sub-health) still takes work but scores lower; UNHEALTHY and LOST take none.
    """

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"
    LOST = "lost"

    @property
    def schedulable(self) -> bool:
        return self in (HealthState.HEALTHY, HealthState.DEGRADED)


class LinkKind(enum.StrEnum):
    """How two devices talk to each other, best first."""

    NVLINK = "nvlink"
    HCCS = "hccs"
    XGMI = "xgmi"
    MLULINK = "mlulink"
    PCIE_SWITCH = "pcie-switch"
    PCIE_HOST = "pcie-host"
    SYSTEM = "system"  # across NUMA nodes / sockets


@dataclass(frozen=True, slots=True)
class Link:
    """A direct path from one device to a peer, with its usable bandwidth."""

    peer_uuid: str
    kind: LinkKind
    gbps: float  # GB/s one direction

    @property
    def p2p(self) -> bool:
        """Whether the devices can exchange memory directly (no bounce through the host)."""
        return self.kind not in (LinkKind.SYSTEM, LinkKind.PCIE_HOST)


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A character device the container needs, as the runtime must create it."""

    path: str
    major: int
    minor: int
    kind: str = "c"  # "c" character, "b" block
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class Device:
    """One accelerator and its fingerprint.

    `tflops_*` are dense (no sparsity) figures from the profile database, or measured on this
    node where a measurement exists. `device_nodes` are per-device; the vendor's shared nodes
    live in `shared_nodes` so that the runtime can merge them once per container.
    """

    uuid: str
    vendor: Vendor
    model: str
    index: int
    pci_bus_id: str
    vram_bytes: int
    numa_node: int = -1
    tflops_fp16: float = 0.0
    tflops_bf16: float = 0.0
    tflops_fp32: float = 0.0
    tops_int8: float = 0.0
    links: tuple[Link, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    shared_nodes: tuple[DeviceNode, ...] = ()
    health_score: int = 100
    health_state: HealthState = HealthState.HEALTHY
    attributes: tuple[tuple[str, str], ...] = ()

    def link_to(self, peer_uuid: str) -> Link | None:
        for link in self.links:
            if link.peer_uuid == peer_uuid:
                return link
        return None


@dataclass(frozen=True, slots=True)
class PodRef:
    """The pod a container belongs to; empty for containers started outside Kubernetes."""

    namespace: str = ""
    name: str = ""
    uid: str = ""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.name else ""


@dataclass(frozen=True, slots=True)
class Grant:
    """A slice of one device held by a container."""

    device_uuid: str
    vram_bytes: int
    # Reserved share of the device's compute, 1..100; 0 reserves none (best effort, shared
    # in time with the device's other holders, and not throttled by libhcs).
    compute_percent: int = 0


class FrontEnd(enum.StrEnum):
    """Which way into hcsd made an allocation: each front end reconciles only its own.

    The NRI plugin learns at Synchronize which containers its runtime still has; it must not
    release what `hcs-runtime` or `hcs-oci-hook` recorded for containers of another runtime,
    nor what an operator allocated. UNKNOWN marks records written before the front end was
    recorded: no front end reconciles them (an operator releases them with hcsctl).
    """

    NRI = "nri"
    RUNC_WRAPPER = "hcs-runtime"
    OCI_HOOK = "hcs-oci-hook"
    API = "api"  # hcsctl and other API clients calling Allocate
    DRA = "dra"  # the kubelet DRA plugin's PrepareClaim: a ResourceClaim's devices
    UNKNOWN = "unknown"

    @classmethod
    def parse(cls, text: str) -> FrontEnd:
        """A recorded or received name; an unknown one (a newer build's) reads as UNKNOWN."""
        try:
            return cls(text)
        except ValueError:
            return cls.UNKNOWN


@dataclass(frozen=True, slots=True)
class Allocation:
    """Who holds which slices: the unit the ledger records and the API reports.

    One allocation per container; a multi-device container holds several grants. The container
    id is the identity, so repeating an operation for the same container is harmless.
    """

    container_id: str
    grants: tuple[Grant, ...]
    pod: PodRef = field(default_factory=PodRef)
    container_name: str = ""
    created: float = 0.0  # unix seconds
    source: str = "api"  # "api", "local" (container annotation), "assignment" (scheduler)
    front_end: FrontEnd = FrontEnd.UNKNOWN  # which way in recorded it

    @property
    def vram_bytes(self) -> int:
        return sum(g.vram_bytes for g in self.grants)

    @property
    def device_uuids(self) -> tuple[str, ...]:
        return tuple(g.device_uuid for g in self.grants)


@dataclass(frozen=True, slots=True)
class Acceptance:
    """A pod whose signed scheduler assignment this node accepted: the sha256 of the
    annotation's exact text, and when. The same text for the same pod is accepted again
    without the age limit and without its key (docs/cluster.md, "Keys")."""

    pod_uid: str
    digest: str
    accepted_at: float  # unix seconds


@dataclass(frozen=True, slots=True)
class VramViolation:
    """A container found holding more device memory than its grant allows (the VRAM watchdog).

    `used_bytes` is what the vendor's driver reports for the container's processes on the
    device; `accounted_bytes` what libhcs recorded in the container's usage region (-1 when
    unknown): a gap between the two means the workload escaped libhcs.
    """

    container_id: str
    device_uuid: str
    used_bytes: int
    granted_bytes: int
    allowed_bytes: int  # the grant plus the tolerance: the line that was crossed
    accounted_bytes: int
    pids: tuple[int, ...]
    action: str  # "warned", "killed", or "kill_failed"
    pod: PodRef = field(default_factory=PodRef)
    container_name: str = ""


class NodeMode(enum.StrEnum):
    """Where requests for a Kubernetes pod's containers may come from (`node.mode`)."""

    # Local `hcs.io/*` annotations and scheduler assignments alike: a host without the
    # cluster side (Docker, nerdctl, CRI without an extender).
    STANDALONE = "standalone"
    # A node the scheduler extender places pods on: a pod's containers get devices only from
    # its signed assignment, so no pod takes devices the scheduler and ComputeQuota never saw.
    # Containers outside any pod (no pod uid) keep local annotations.
    CLUSTER = "cluster"


class SpreadPolicy(enum.StrEnum):
    """Where a request lands among devices that fit it."""

    BINPACK = "binpack"  # fill partly used devices first: keeps whole devices free
    SPREAD = "spread"  # least used device first: less interference


class TopologyPreference(enum.StrEnum):
    NONE = ""
    HIGH_BANDWIDTH = "high-bandwidth"


@dataclass(frozen=True, slots=True)
class Request:
    """What a container asks of this node.

    `vram_bytes` is per device; None means whole devices. `tflops_fp16`, when set, is the total
    the container wants and decides how many devices of the chosen model it gets.
    """

    container_id: str
    vram_bytes: int | None = None
    devices: int = 1
    tflops_fp16: float | None = None
    compute_percent: int = 0  # 0: no reservation; whole-device requests reserve 100
    vendors: frozenset[Vendor] = frozenset()
    models: frozenset[str] = frozenset()
    policy: SpreadPolicy | None = None  # None: the node's configured policy
    topology: TopologyPreference = TopologyPreference.NONE
    pod: PodRef = field(default_factory=PodRef)
    container_name: str = ""
    source: str = "api"
    front_end: FrontEnd = FrontEnd.API

    def __post_init__(self) -> None:
        if not self.container_id:
            raise ValueError("container id must not be empty")
        if len(self.container_id) > 256:
            raise ValueError("container id is too long (at most 256 characters)")
        if self.devices < 1:
            raise ValueError(f"devices must be at least 1, got {self.devices}")
        if self.devices > 64:
            raise ValueError(f"devices must be at most 64, got {self.devices}")
        if self.vram_bytes is not None and self.vram_bytes <= 0:
            raise ValueError(f"vram must be positive, got {self.vram_bytes}")
        if self.tflops_fp16 is not None and not self.tflops_fp16 > 0:
            raise ValueError(f"tflops-fp16 must be positive, got {self.tflops_fp16}")
        if not 0 <= self.compute_percent <= 100:
            raise ValueError(f"compute share must be 0..100 percent, got {self.compute_percent}")
