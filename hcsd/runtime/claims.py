"""DRA mode on the node: a ResourceClaim's devices held in the ledger, and its CDI spec.

The kubelet plugin (in hcs-syncer, which has the cluster credentials) reads the claim's
allocation and hands hcsd the devices by their ResourceSlice names (`nvidia-0`) with the
capacity each result consumed. hcsd then does for the claim what the NRI plugin does for a
container, once, before any of the claim's containers exists:
- holds the slices in the ledger under `claim-<uid>` (FrontEnd.DRA, source `claim`): a claim
  prepared again, after a kill -9 of hcsd or of the syncer, finds them held and gets the same
  answer; the same uid with other devices is a conflict;
- writes the quota file and the usage region under `<run_dir>/claims/claim-<uid>/` (the same
  `QuotaFiles` the containers use; its own directory, which the NRI reconcile never sweeps);
- writes `<cdi_dir>/compute.hcs.io-claim_<uid>.json`, kind `compute.hcs.io/claim`: one device
  per claimed device, `<uid>-<device name>`, carrying its own device nodes; the spec's own
  `containerEdits` carry what every container of the claim needs once (the vendor's shared
  nodes, driver mounts and selection env for all the claim's devices, libhcs, the preload
  file, the quota file and region, HCS_CONFIG): the same edits as `Injector.create`, merged by
  the same functions. The runtime applies the spec's edits when it injects any of its devices.

The container's user is not known when a claim is prepared (kubelet prepares before it
creates containers), so the usage region is written as root's 0666, as for a runtime that does
not say who the container runs as (container_files.py); the NRI plugin gives it to the user of
the claim's container when it creates it (claim_links.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hcsd.contract import dra
from hcsd.fs import OsFileSystem, write_atomic
from hcsd.model import Allocation, Device, FrontEnd, Grant, PodRef
from hcsd.refusals import Reason, Refusal
from hcsd.runtime import claim_runtime
from hcsd.runtime.cdi import CDI_VERSION, cdi_edits
from hcsd.runtime.claim_runtime import ClaimRuntime
from hcsd.runtime.container_files import QuotaFiles
from hcsd.runtime.edits import ContainerEdits, merge
from hcsd.runtime.env_merge import PATH_LISTS
from hcsd.runtime.settings import DriverPaths
from hcsd.runtime.vendors import vendor_edits
from hcsd.service import NodeService

__all__ = ["CLAIM_SOURCE", "ClaimDevice", "Claims", "PreparedClaim", "claim_key"]

log = logging.getLogger(__name__)

CLAIM_SOURCE = "claim"  # an Allocation's source for a claim's devices
CLAIMS_DIR = "claims"  # under run_dir: one quota directory per claim
SPEC_MODE = 0o600  # read by the root runtime only, as hcsd's other spec
_UID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One allocation result of the claim for this driver on this node."""

    request: str
    device: str  # `<vendor>-<index>`, the ResourceSlice's and the CDI device's name
    pool: str = ""
    share_id: str = ""
    memory_bytes: int | None = None  # None: the whole device's memory
    compute_percent: int | None = None  # None: no share reserved (whole device: 100)


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    allocation: Allocation
    # per result, in the order given: its CDI device ids
    cdi_ids: tuple[tuple[str, ...], ...]


def claim_key(uid: str) -> str:
    """The ledger key (and quota directory name) of a claim."""
    return f"claim-{uid}"


def _check_uid(uid: str) -> None:
    """A uid names a file and a ledger record: lower-case letters, digits and '-' only
    (what the API server generates), at most 63 characters."""
    if not uid or len(uid) > 63 or not set(uid) <= _UID_CHARS or uid[0] == "-":
        raise ValueError(f"claim uid {uid[:80]!r} is not a Kubernetes uid")


class Claims:
    def __init__(
        self,
        service: NodeService,
        run_dir: str,
        libhcs_path: str,
        driver_paths: DriverPaths,
        cdi_dir: str,
    ) -> None:
        self.service = service
        self.quota = QuotaFiles(run_dir, libhcs_path, kind=CLAIMS_DIR)
        self.driver_paths = driver_paths
        self.cdi_dir = cdi_dir

    def spec_path(self, uid: str) -> str:
        kind = dra.CDI_CLAIM_KIND.replace("/", "-")
        return os.path.join(self.cdi_dir, f"{kind}_{uid}.json")

    def prepare(
        self,
        claim: PodRef,
        results: Sequence[ClaimDevice],
        runtime: ClaimRuntime | None = None,
    ) -> tuple[PreparedClaim, bool]:
        """Hold the claim's devices and write its files (with `runtime`, the RuntimeProfile
        the kubelet plugin resolved for its containers: claim_runtime.py); (what was
        prepared, whether the ledger record is new). Raises Refusal; files of a claim held
        anew are removed again when they cannot be written."""
        label = f"claim {claim.namespace}/{claim.name} ({claim.uid})"
        try:
            _check_uid(claim.uid)
            if not results:
                raise ValueError("no devices of this driver are allocated to it on this node")
            if not self.cdi_dir:
                raise ValueError("runtime.cdi_dir is empty: hcsd writes no CDI specs")
            devices, grants = self._grants(results)
        except ValueError as e:
            raise self.service.refuse(Refusal(Reason.INVALID_REQUEST, f"{label}: {e}")) from e
        key = claim_key(claim.uid)
        held, created = self.service.hold(
            Allocation(key, grants, claim, "", self.service.clock(), CLAIM_SOURCE, FrontEnd.DRA)
        )
        try:
            quota = self.quota.prepare(key, held.grants, devices)
            ours = self._write_spec(claim.uid, devices, quota)
            if runtime is not None:
                claim_runtime.write(
                    self.quota.directory(key), replace(runtime, hcsd_env=frozenset(ours))
                )
        except (OSError, ValueError) as e:
            if created:
                self.unprepare(claim.uid)
            raise self.service.refuse(
                Refusal(Reason.PREPARE_FAILED, f"{label}: failed to prepare the claim: {e}")
            ) from e
        ids = tuple((self.cdi_id(claim.uid, r.device),) for r in results)
        if created:
            log.info("%s: prepared %s", label, ", ".join(sorted({r.device for r in results})))
        return PreparedClaim(held, ids), created

    def unprepare(self, uid: str) -> bool:
        """Release the claim's devices and remove its files; whether it held any."""
        try:
            _check_uid(uid)
        except ValueError as e:
            raise self.service.refuse(Refusal(Reason.INVALID_REQUEST, str(e))) from e
        released = self.service.release(claim_key(uid))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.spec_path(uid))
        self.quota.remove(claim_key(uid))
        return released is not None

    @staticmethod
    def cdi_id(uid: str, device: str) -> str:
        return f"{dra.CDI_CLAIM_KIND}={uid}-{device}"

    def _grants(self, results: Sequence[ClaimDevice]) -> tuple[list[Device], tuple[Grant, ...]]:
        """One grant per device (two shares of one device in one claim add up)."""
        by_name = {
            f"{s.device.vendor.value}-{s.device.index}": s.device for s in self.service.devices()
        }
        sums: dict[str, tuple[int, int]] = {}
        for result in results:
            device = by_name.get(result.device)
            if device is None:
                raise ValueError(f"device {result.device!r} is not on this node")
            memory = device.vram_bytes if result.memory_bytes is None else result.memory_bytes
            compute = 100 if result.memory_bytes is None and result.compute_percent is None else 0
            compute = result.compute_percent if result.compute_percent is not None else compute
            if memory <= 0:
                raise ValueError(f"device {result.device}: no memory consumed")
            old = sums.get(result.device, (0, 0))
            sums[result.device] = (old[0] + memory, min(100, old[1] + compute))
        devices = [by_name[name] for name in sums]
        grants = tuple(Grant(by_name[n].uuid, m, c) for n, (m, c) in sums.items())
        return devices, grants

    def _write_spec(self, uid: str, devices: Sequence[Device], quota: ContainerEdits) -> list[str]:
        """Write the claim's CDI spec; the names of the variables its edits set."""
        by_vendor: dict[str, list[Device]] = {}
        for device in devices:
            by_vendor.setdefault(device.vendor.value, []).append(device)
        common = merge(
            [*(vendor_edits(group, self.driver_paths) for group in by_vendor.values()), quota]
        )
        own = {n.path for d in devices for n in d.device_nodes}
        shared = ContainerEdits(
            devices=tuple(n for n in common.devices if n.path not in own),
            env=common.env,
            mounts=common.mounts,
        )
        spec = {
            "cdiVersion": CDI_VERSION,
            "kind": dra.CDI_CLAIM_KIND,
            "containerEdits": cdi_edits(shared),
            "devices": [
                {
                    "name": f"{uid}-{d.vendor.value}-{d.index}",
                    "containerEdits": cdi_edits(ContainerEdits(devices=d.device_nodes)),
                }
                for d in devices
            ],
        }
        os.makedirs(self.cdi_dir, mode=0o755, exist_ok=True)
        text = json.dumps(spec, indent=2, sort_keys=True) + "\n"
        write_atomic(OsFileSystem(), self.spec_path(uid), text.encode(), mode=SPEC_MODE)
        return [name for name, _ in common.env if name not in PATH_LISTS]
