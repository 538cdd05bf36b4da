"""What each vendor's containers need besides their device nodes: selection env, driver
mounts, library path, and the communication settings when the devices lack peer-to-peer.

Driver paths come from `[runtime.driver_paths]` (defaults: the usual install locations of the
vendors' container runtimes); only those that exist on this host are mounted. The NVIDIA
and Cambricon drivers' files are found one by one as libnvidia-container and Cambricon's
device plugin find them (`driver_files.py`), the Ascend driver's from Ascend Docker Runtime's
mount list (`ascend_files.py`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hcsd.model import Device, Vendor
from hcsd.runtime.ascend_files import ascend_list_mounts
from hcsd.runtime.driver_files import driver_file_mounts
from hcsd.runtime.edits import ContainerEdits, MountEdit
from hcsd.runtime.settings import DriverPaths
from hcsd.runtime.vendor_cdi import vendor_spec_edits

log = logging.getLogger(__name__)

__all__ = ["VENDOR_RUNTIME", "VendorRuntime", "vendor_edits"]


@dataclass(frozen=True, slots=True)
class VendorRuntime:
    host_selection_env: tuple[str, ...]  # set to host ids/uuids (vendor runtimes read these)
    app_selection_env: tuple[str, ...]  # set to 0..n-1: the ordinals the app sees
    select_by_uuid: bool
    no_p2p_env: tuple[tuple[str, str], ...]


VENDOR_RUNTIME: Mapping[Vendor, VendorRuntime] = {
    Vendor.NVIDIA: VendorRuntime(
        ("NVIDIA_VISIBLE_DEVICES",),
        ("CUDA_VISIBLE_DEVICES",),
        True,
        (("NCCL_P2P_DISABLE", "1"),),
    ),
    Vendor.ASCEND: VendorRuntime(
        ("ASCEND_VISIBLE_DEVICES",),
        ("ASCEND_RT_VISIBLE_DEVICES",),
        False,
        (("HCCL_INTRA_ROCE_ENABLE", "1"), ("HCCL_INTRA_PCIE_ENABLE", "0")),
    ),
    Vendor.HYGON: VendorRuntime(
        (),
        ("HIP_VISIBLE_DEVICES",),
        False,
        (("NCCL_P2P_DISABLE", "1"),),
    ),
    Vendor.CAMBRICON: VendorRuntime(
        ("CAMBRICON_VISIBLE_DEVICES",),
        ("MLU_VISIBLE_DEVICES",),
        False,
        (("CNCL_MLULINK_DISABLE", "1"),),
    ),
}


_DEFAULT_PATHS = DriverPaths()


def vendor_edits(
    devices: Sequence[Device],
    driver_paths: DriverPaths = _DEFAULT_PATHS,
    vendor_specs: Sequence[str] | None = None,
) -> ContainerEdits:
    """Edits for a container holding `devices` (all of one vendor)."""
    if not devices:
        return ContainerEdits()
    vendor = devices[0].vendor
    if any(d.vendor is not vendor for d in devices):
        raise ValueError("one container holds devices of one vendor")
    spec = VENDOR_RUNTIME[vendor]
    nodes = [n for d in devices for n in d.device_nodes] + list(devices[0].shared_nodes)
    host_ids = ",".join(d.uuid if spec.select_by_uuid else str(d.index) for d in devices)
    ordinals = ",".join(str(i) for i in range(len(devices)))
    env = [(name, host_ids) for name in spec.host_selection_env]
    env += [
        (name, host_ids if spec.select_by_uuid else ordinals) for name in spec.app_selection_env
    ]
    from_vendor = vendor_spec_edits(vendor, vendor_specs)
    if from_vendor is not None:  # the vendor's generator knows its driver best
        mounts = list(from_vendor.mounts)
        env = [*from_vendor.env, *env]  # our device selection comes last and wins
    else:
        mounts = [MountEdit(p, p) for p in driver_paths.of(vendor) if os.path.exists(p)]
        if vendor is Vendor.CAMBRICON:
            _warn_unmounted_neuware(driver_paths)
        directories = [m.container_path for m in mounts]
        found: list[MountEdit] = []
        files = driver_paths.files_of(vendor)
        if files is not None:  # the driver's files, found as the vendor's runtime finds them
            found = driver_file_mounts(files)
        elif vendor is Vendor.ASCEND:  # and as Ascend Docker Runtime does, from its list
            found = ascend_list_mounts(driver_paths.ascend_files)
        for mount in found:  # a read-only directory mount already covers (and would block) it
            if any(_under(mount.container_path, d) for d in directories):
                log.info("not mounting %r: inside the driver directory mounted", mount.host_path)
            elif mount not in mounts:
                mounts.append(mount)
        libraries = [d for d in driver_paths.library_path.of(vendor) if _populated(d, mounts)]
        if libraries:
            env.append(("LD_LIBRARY_PATH", ":".join(libraries)))
    if len(devices) > 1 and not _all_p2p(devices):
        env.extend(spec.no_p2p_env)
    return ContainerEdits(devices=tuple(nodes), env=tuple(env), mounts=tuple(mounts))


NEUWARE = "/usr/local/neuware"
_warned_neuware: set[str] = set()


def _warn_unmounted_neuware(driver_paths: DriverPaths) -> None:
    """Once per host root: the host has Neuware and it is no longer mounted. Its whole-directory
    mount was the default before; images that relied on it lose it on upgrade, silently but
    for this line, which names the setting that brings it back."""
    root = driver_paths.cambricon_files.driver_root
    if root in _warned_neuware or any(_under(NEUWARE, p) for p in driver_paths.cambricon):
        return
    if os.path.isdir(os.path.join(root, NEUWARE.lstrip("/"))):
        _warned_neuware.add(root)
        log.warning(
            "the host's %s is not mounted into Cambricon containers (no longer by default: "
            "images bring their own Neuware); set [runtime.driver_paths] cambricon = [%r] "
            "if they rely on the host's",
            NEUWARE,
            NEUWARE,
        )


def _populated(directory: str, mounts: Sequence[MountEdit]) -> bool:
    """The container gets something in `directory`: a mount inside it, or a mount of a host
    directory that holds it."""
    for m in mounts:
        if m.container_path != directory and _under(m.container_path, directory):
            return True
        inside = directory[len(m.container_path) :]
        if _under(directory, m.container_path) and os.path.isdir(m.host_path + inside):
            return True
    return False


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _all_p2p(devices: Sequence[Device]) -> bool:
    for position, a in enumerate(devices):
        for b in devices[position + 1 :]:
            link = a.link_to(b.uuid)
            if link is None or not link.p2p:
                return False
    return True
