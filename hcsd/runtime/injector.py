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

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from hcsd.contract.assignment import ANNOTATION, AssignmentError
from hcsd.contract.names import container_id_problem
from hcsd.contract.runtime_binding import ResolvedRuntime, RuntimeBindingError
from hcsd.model import Allocation, Device, FrontEnd, NodeMode
from hcsd.refusals import Reason, Refusal
from hcsd.runtime import claim_runtime, runtime_profile
from hcsd.runtime.acceptance import Acceptances
from hcsd.runtime.annotations import RequestError, local_request, requested_keys
from hcsd.runtime.claim_links import ClaimLinks
from hcsd.runtime.claims import CLAIMS_DIR
from hcsd.runtime.container_files import QuotaFiles
from hcsd.runtime.container_info import ContainerInfo
from hcsd.runtime.edits import ContainerEdits, merge
from hcsd.runtime.presence import ContainerView, RunningContainer, asks_for_devices, missing_edits
from hcsd.runtime.resume import Resume, Resumes
from hcsd.runtime.settings import RuntimeSection
from hcsd.runtime.vendors import vendor_edits
from hcsd.service import NodeService

__all__ = ["ContainerInfo", "Injector", "InjectorSettings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InjectorSettings:
    node_name: str
    run_dir: str
    # libhcs, the assignments' maximum age, the driver paths
    runtime: RuntimeSection = field(default_factory=RuntimeSection)
    # One key under the id "" (version-1 assignments), for tests and embedders
    assignment_key: bytes = b""
    # Called per new assignment when set: kid -> key, the daemon's keyring file, re-read when
    # InstallKeys or an operator changes it (wins over `assignment_key`).
    keyring: Callable[[], Mapping[str, bytes]] | None = None
    # `node.mode`: in cluster mode a pod's containers get devices only from an assignment
    mode: NodeMode = NodeMode.STANDALONE


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
        self.resumes = Resumes(settings.runtime.checkpoints)
        claim_files = QuotaFiles(settings.run_dir, settings.runtime.libhcs_path, kind=CLAIMS_DIR)
        self.claim_links = ClaimLinks(service, claim_files)  # DRA claims' containers
        # Containers the runtime said have ended (a stop, a removal, a reconcile not listing
        # them) whose quota directory could not be removed then: the sweep tries again.
        self._ended: set[str] = set()
        # Directories kept by the sweep for want of knowing their container ended (logged once)
        self._kept: set[str] = set()
        self.acceptances = Acceptances(
            service,
            settings.keyring or (lambda: {"": settings.assignment_key}),
            node=settings.node_name,
            max_age=settings.runtime.assignment_max_age,
            forget_after=settings.runtime.assignment_forget_after,
            clock=clock,
        )

    async def resume(self, info: ContainerInfo, *, timeout: float | None = None) -> Resume | None:
        """The container's checkpoint resume status, looked for before `create` (outside the
        allocation, without blocking the loop); None for a container that does not ask for
        devices or names no checkpoint directory (docs/runtime.md, Checkpoint resume)."""
        if not asks_for_devices(info):
            return None
        return await self.resumes.look(
            info.label,
            info.container_annotations,
            info.pod_annotations,
            info.mounts,
            timeout=timeout,
        )

    def create(self, info: ContainerInfo, resume: Resume | None = None) -> ContainerEdits | None:
        """Allocate (durably) and return the container's edits; None if it asks for nothing.
        `resume` (from `resume`) is added only when the container gets devices.

        Raises Refusal when the container must not start, with a text that begins with the
        container's label; an allocation whose files cannot be prepared is released again.
        """
        held, profile = self._allocation(info)
        if held is None:
            edits = self._claim_profile(info)  # a refusal comes before the link
            self.claim_links.link(info)  # a claim's devices come through CDI, not from here
            return edits
        self._ended.discard(info.container_id)  # the same id created again runs again
        devices = self._devices(info, held)
        try:
            edits = merge(
                [
                    vendor_edits(devices, self.settings.runtime.driver_paths),
                    self.quota.prepare(info.container_id, held.grants, devices, info.user),
                    resume.edits if resume is not None else ContainerEdits(),
                ]
            )
            if profile is not None:
                edits = runtime_profile.apply(edits, profile, info.label)
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
        """The container's processes are gone: its device memory is free again, and nothing
        mounts its quota directory any more, so that goes now too (kubelet removes a dead
        container only at its next garbage collection, up to a minute later). A runtime that
        starts the same container again fails to start it: its quota files are bind-mount
        sources, and runc refuses a bind mount whose source does not exist,
        so the container fails closed rather than running with no quota (CRI never does this:
        kubelet creates a new container). A later RemoveContainer (or a second stop) finds
        nothing left and does nothing. Pods gone long enough are forgotten
        (`Acceptances.sweep`)."""
        self.service.release(container_id)
        self.claim_links.unlink(container_id)
        self._remove_directory(container_id)
        self.acceptances.sweep()

    def removed(self, container_id: str) -> None:
        """The container is gone from the runtime: the same as a stop, if none came."""
        self.stopped(container_id)

    def pod_started(self, pod_uid: str) -> None:
        """The runtime started the pod's sandbox: its first container's assignment is aged
        from now (`Acceptances`), however long images and volumes then take."""
        self.acceptances.sandbox_started(pod_uid)

    def pod_removed(self, pod_uid: str) -> None:
        self.acceptances.sandbox_removed(pod_uid)

    def sweep(self) -> list[str]:
        """Remove the quota directories left by containers that have ended; their ids.

        Only a container the runtime said has ended (a stop, a removal, a reconcile that does
        not list it) loses its directory: one whose removal failed then is tried again here.
        A directory whose container holds no allocation is not enough: an allocation released
        while its container runs (`hcsctl release`, the API's Release) leaves a running
        container whose libhcs reads quota.conf at each new process, and would fail closed
        without it. Such a directory, and one left by a crash between a stop's release and its
        removal under a front end that cannot list its containers (`hcs-runtime`,
        `hcs-oci-hook`), stays and is logged once: it goes at the container's stop, at the next
        reconcile with an NRI runtime, or at the node's reboot (/run). Runs on the event loop
        like every create, stop and removal, so it never sees a directory being prepared."""
        self.acceptances.sweep()  # and the accepted assignments of pods long gone
        swept = []
        present = self.quota.present()
        self._kept &= set(present)
        for container_id in present:
            if container_id in self._ended:
                if self._remove_directory(container_id):
                    swept.append(container_id)
            elif container_id not in self._kept and self.service.allocation(container_id) is None:
                self._kept.add(container_id)
                log.info(
                    "%s: keeping its quota directory: it holds no allocation, but hcsd has not "
                    "seen its container end (an allocation released while it runs, or a stop "
                    "missed while hcsd was down); it goes at the container's stop",
                    container_id,
                )
        if swept:
            log.info(
                "swept %d quota director%s of containers that have ended: %s",
                len(swept),
                "y" if len(swept) == 1 else "ies",
                ", ".join(swept),
            )
        return swept

    def _remove_directory(self, container_id: str) -> bool:
        """Remove an ended container's directory; remember it for the sweep if that fails."""
        self._kept.discard(container_id)
        if self.quota.remove(container_id):
            self._ended.discard(container_id)
            return True
        self._ended.add(container_id)
        return False

    async def sweep_every(self, interval: float) -> None:
        """`sweep` every `interval` seconds (a supervised task of the daemon)."""
        while True:
            await asyncio.sleep(interval)
            self.sweep()

    def verify_injected(
        self, info: ContainerInfo, edits: ContainerEdits, view: ContainerView
    ) -> None:
        """Refuse (and release) a container whose spec lacks hcsd's devices or quota edits.

        For `hcs-oci-hook`, which sees the final OCI config: a runtime that injected the
        devices some other way (CDI) but not libhcs would run the container without its quota.
        """
        missing = missing_edits(edits, view)
        if not missing:
            return
        self.removed(info.container_id)
        raise self.service.refuse(
            Refusal(
                Reason.NOT_INJECTED,
                f"{info.label}: hcsd's edits were not injected: {', '.join(missing)} "
                "(the runtime must run hcsd's NRI plugin: CDI or a device plugin alone gives "
                "no quota)",
            )
        )

    def reconcile(
        self, running: Sequence[RunningContainer], front_end: FrontEnd = FrontEnd.NRI
    ) -> list[str]:
        """Match the ledger to the containers the runtime has (after a runtime or hcsd restart).

        Releases what this front end recorded for containers that are gone; allocations of
        other front ends (another runtime's wrapper or hook, an operator's API call) are theirs
        to release. Then finds the containers that asked for devices and run without hcsd's
        edits (created past the runtime's request timeout, or while hcsd was not registered):
        releases what hcsd holds for them, counts and logs them. Returns the released ids.
        """
        alive = {c.info.container_id for c in running}
        self.claim_links.reconcile(c.info for c in running)
        released = []
        untracked = []
        for allocation in self.service.allocations():
            if allocation.container_id in alive or allocation.source not in (
                "local",
                "assignment",
            ):
                continue
            if allocation.front_end is front_end:
                self.removed(allocation.container_id)
                released.append(allocation.container_id)
            elif allocation.front_end is FrontEnd.UNKNOWN:
                untracked.append(allocation.container_id)
        for leftover in self.quota.present():
            if leftover not in alive and self.service.allocation(leftover) is None:
                self._remove_directory(leftover)
        self.acceptances.sweep()
        if released:
            log.info(
                "reconciled with the runtime: released %d allocation(s) of containers that "
                "are gone: %s",
                len(released),
                ", ".join(released),
            )
        if untracked:
            log.info(
                "reconciled with the runtime: left %d allocation(s) recorded before hcsd kept "
                "their front end, whose containers this runtime does not list: %s (release "
                "each with `hcsctl release ID` once its container is gone)",
                len(untracked),
                ", ".join(untracked),
            )
        return released + self._uninjected(running, front_end)

    def _uninjected(self, running: Sequence[RunningContainer], front_end: FrontEnd) -> list[str]:
        """Release and report the running containers that asked for devices and lack hcsd's
        edits; those another front end serves are left to it."""
        released = []
        for container in running:
            info = container.info
            held = self.service.allocation(info.container_id)
            if held is not None and held.front_end is not front_end:
                continue
            if container.view.has_quota_edits(
                self.quota.preload_file, self.quota.quota_file(info.container_id)
            ):
                continue
            if held is None and not asks_for_devices(info):
                continue
            self.service.count_uninjected()
            if held is not None:
                self.removed(info.container_id)
                released.append(info.container_id)
                why = (
                    "the runtime created it without the edits hcsd answered with (a "
                    "request past its timeout); released what hcsd held for it"
                )
            else:
                why = "it was created while hcsd was not registered with the runtime"
            log.warning(
                "%s: asked for devices but runs without hcsd's devices and quota: %s; "
                "recreate it (delete the pod or container) to start it with them",
                info.label,
                why,
            )
        return released

    def _claim_profile(self, info: ContainerInfo) -> ContainerEdits | None:
        """DRA mode: the edits of the RuntimeProfile the kubelet plugin resolved for this
        container's claim (claim_runtime.py), checked as from an assignment; None without."""
        key = self.claim_links.claim_of(info)
        try:
            record = (
                None if key is None else claim_runtime.read(self.claim_links.files.directory(key))
            )
        except RuntimeBindingError as e:
            raise self.service.refuse(Refusal(Reason.RUNTIME_PROFILE, f"{info.label}: {e}")) from e
        profile = None if record is None else record.for_container(info.pod.uid, info.label)
        if profile is None:
            return None
        refusal = runtime_profile.refusal(info, profile, granted=True)
        if refusal is not None:
            raise self.service.refuse(refusal)
        return runtime_profile.apply(ContainerEdits(), profile, info.label)

    def _allocation(self, info: ContainerInfo) -> tuple[Allocation | None, ResolvedRuntime | None]:
        """The allocation now held for this container (in the ledger), or None; with the
        runtime profile its verified assignment resolves for it."""
        text = info.pod_annotations.get(ANNOTATION)
        if text is not None:
            try:
                assignment = self.acceptances.check(text, info.pod.uid)
            except AssignmentError as e:
                raise self.service.refuse(
                    Refusal(Reason.BAD_ASSIGNMENT, f"{info.label}: {e}")
                ) from e
            grants = assignment.containers.get(info.container_name)
            profile = assignment.runtime.get(info.container_name)
            refusal = runtime_profile.refusal(info, profile, granted=bool(grants))
            if refusal is not None:
                raise self.service.refuse(refusal)
            if not grants:
                return None, None  # the scheduler gave this container nothing (a sidecar)
            self._check_id(info)
            allocation = Allocation(
                info.container_id,
                grants,
                info.pod,
                info.container_name,
                self.clock(),
                "assignment",
                info.front_end,
            )
            held, _ = self.service.hold(allocation)
            return held, profile
        asked = requested_keys(info.container_annotations, info.pod_annotations)
        if asked and self.settings.mode is NodeMode.CLUSTER and info.pod.uid:
            raise self.service.refuse(
                Refusal(
                    Reason.NO_ASSIGNMENT,
                    f"{info.label}: asks for devices with {', '.join(asked)} but has no "
                    'scheduler assignment, and this node runs with node.mode = "cluster": a '
                    "pod gets devices here only through its hcs.io/assignment (request "
                    "ai.compute/* resources and let the scheduler place it)",
                )
            )
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
            return None, None
        self._check_id(info)
        held, _, _ = self.service.allocate(replace(request, front_end=info.front_end))
        return held, None

    def _check_id(self, info: ContainerInfo) -> None:
        """The id names the container's directory and ledger record: refuse one the contract
        does not allow before anything is recorded (its text only escaped, never as a label)."""
        problem = container_id_problem(info.container_id)
        if problem is not None:
            raise self.service.refuse(Refusal(Reason.INVALID_REQUEST, problem))

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
