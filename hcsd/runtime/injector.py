"""From a container about to be created to its edits, with the allocation in the ledger first.

Runtime-neutral: the NRI plugin, the runc wrapper and the OCI hook all call `create` with the
pod's and the container's identity and annotations, and turn the returned edits into their own
format. Precedence: a signed scheduler assignment for the pod wins; otherwise the container's
(then the pod's) `hcs.io/*` annotations make a local request; otherwise the container is not
ours and gets no edits.

Every refusal is a `Refusal` (hcsd/refusals.py) counted and logged by the service; the front
ends map it to their own status through the one table there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from hcsd.contract.assignment import ANNOTATION, AssignmentError, verify
from hcsd.model import Allocation, Device, PodRef
from hcsd.refusals import Reason, Refusal
from hcsd.runtime.annotations import RequestError, local_request
from hcsd.runtime.edits import ContainerEdits, merge
from hcsd.runtime.quota import QuotaFiles
from hcsd.runtime.settings import RuntimeSection
from hcsd.runtime.vendors import vendor_edits
from hcsd.service import NodeService

__all__ = ["ContainerInfo", "Injector", "InjectorSettings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    container_id: str
    container_name: str
    pod: PodRef
    container_annotations: Mapping[str, str] = field(default_factory=dict)
    pod_annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """`ns/pod/container` as log lines about a container start (or the id alone)."""
        if self.pod.name:
            return f"{self.pod}/{self.container_name or self.container_id[:12]}"
        return self.container_id


@dataclass(frozen=True, slots=True)
class InjectorSettings:
    node_name: str
    run_dir: str
    # libhcs, the assignments' maximum age, the driver paths
    runtime: RuntimeSection = field(default_factory=RuntimeSection)
    assignment_key: bytes = b""
    # Called per assignment when set: the daemon's key file, re-read when hcs-syncer installs
    # or rotates it (wins over `assignment_key`).
    key_loader: Callable[[], bytes] | None = None


class Injector:
    def __init__(
        self,
        service: NodeService,
        settings: InjectorSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.service = service
        self.settings = settings
        self.clock = clock
        self.quota = QuotaFiles(settings.run_dir, settings.runtime.libhcs_path)

    def create(self, info: ContainerInfo) -> ContainerEdits | None:
        """Allocate (durably) and return the container's edits; None if it asks for nothing.

        Raises Refusal when the container must not start, with a text that begins with the
        container's label; an allocation whose files cannot be prepared is released again.
        """
        held = self._allocation(info)
        if held is None:
            return None
        devices = self._devices(info, held)
        try:
            edits = merge(
                [
                    vendor_edits(devices, self.settings.runtime.driver_paths),
                    self.quota.prepare(info.container_id, held.grants, devices),
                ]
            )
        except (OSError, ValueError) as e:
            self.service.release(info.container_id)
            # A ValueError is the container's own input (its id, an assignment mixing vendors).
            reason = Reason.INVALID_REQUEST if isinstance(e, ValueError) else Reason.PREPARE_FAILED
            raise self.service.refuse(
                Refusal(reason, f"{info.label}: failed to prepare the container: {e}")
            ) from e
        log.info(
            "%s: injecting %d device node(s) for %s",
            info.label,
            len(edits.devices),
            ", ".join(d.uuid for d in devices),
        )
        return edits

    def stopped(self, container_id: str) -> None:
        """The container's processes are gone: its device memory is free again."""
        self.service.release(container_id)

    def removed(self, container_id: str) -> None:
        self.service.release(container_id)
        self.quota.remove(container_id)

    def reconcile(self, running: Iterable[str]) -> list[str]:
        """Release what containers that no longer run hold (after a runtime or hcsd restart).

        Only allocations made for containers (local or assignment) are touched; those made
        through the API by an operator are theirs to release.
        """
        alive = set(running)
        released = []
        for allocation in self.service.allocations():
            if allocation.source in ("local", "assignment") and (
                allocation.container_id not in alive
            ):
                self.removed(allocation.container_id)
                released.append(allocation.container_id)
        for leftover in self.quota.present():
            if leftover not in alive and self.service.allocation(leftover) is None:
                self.quota.remove(leftover)
        if released:
            log.info(
                "reconciled with the runtime: released %d allocation(s) of containers that "
                "are gone: %s",
                len(released),
                ", ".join(released),
            )
        return released

    def _allocation(self, info: ContainerInfo) -> Allocation | None:
        """The allocation now held for this container (in the ledger), or None."""
        text = info.pod_annotations.get(ANNOTATION)
        if text is not None:
            try:
                key = self.settings.key_loader or (lambda: self.settings.assignment_key)
                assignment = verify(
                    text,
                    key(),
                    node=self.settings.node_name,
                    pod_uid=info.pod.uid,
                    now=self.clock(),
                    max_age=self.settings.runtime.assignment_max_age,
                )
            except AssignmentError as e:
                raise self.service.refuse(
                    Refusal(Reason.BAD_ASSIGNMENT, f"{info.label}: {e}")
                ) from e
            grants = assignment.containers.get(info.container_name)
            if not grants:
                return None  # the scheduler gave this container nothing (e.g. a sidecar)
            allocation = Allocation(
                info.container_id, grants, info.pod, info.container_name, self.clock(), "assignment"
            )
            held, _ = self.service.hold(allocation)
            return held
        try:
            request = local_request(
                info.container_id,
                info.container_name,
                info.pod,
                info.container_annotations,
                info.pod_annotations,
            )
        except (RequestError, ValueError) as e:
            raise self.service.refuse(Refusal(Reason.INVALID_REQUEST, f"{info.label}: {e}")) from e
        if request is None:
            return None
        held, _, _ = self.service.allocate(request)
        return held

    def _devices(self, info: ContainerInfo, allocation: Allocation) -> list[Device]:
        devices = []
        for grant in allocation.grants:
            device = self.service.device(grant.device_uuid)
            if device is None:  # held from before a device was lost: nothing to inject
                raise self.service.refuse(
                    Refusal(
                        Reason.NO_MATCHING_DEVICE,
                        f"{info.label}: device {grant.device_uuid} is not on this node",
                    )
                )
            devices.append(device)
        return devices
