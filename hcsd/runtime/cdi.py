"""The CDI spec of this node's devices: `/var/run/cdi/hcs.io-device.yaml`, kind `hcs.io/device`.

An operator interface, not a tenant one: a device named here (`hcs.io/device=GPU-…` or
`hcs.io/device=nvidia-0`) is a whole device injected by the runtime itself, with no ledger
entry and no quota file, so the allocator may hand the same device to a tenant at the same
time. The spec is therefore root-only (0600): root runtimes (containerd, CRI-O, root podman)
read it, rootless ones cannot. Tenants get devices through hcsd (NRI, hcs-runtime,
hcs-oci-hook), which records them first; hcs-oci-hook refuses a container whose devices came
by CDI without hcsd's quota edits. Each device entry carries its own nodes, the vendor's shared
nodes, driver mounts and selection env, from the same edits the NRI plugin uses, and libhcs
with the preload file, so that processes in such a container run under libhcs too (with no
quota file it enforces nothing: the device is whole). Written as JSON, which is YAML too (CDI
readers accept both), atomically.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from typing import Any

from hcsd.contract import names
from hcsd.fs import OsFileSystem, write_atomic
from hcsd.model import Device
from hcsd.runtime.edits import ContainerEdits, merge
from hcsd.runtime.settings import DriverPaths
from hcsd.runtime.vendors import vendor_edits
from hcsd.service import EventKind, NodeService, WatchOverflow

__all__ = [
    "CDI_KIND",
    "CDI_VERSION",
    "SPEC_NAME",
    "cdi_edits",
    "keep_spec_current",
    "publish_spec",
    "render_spec",
    "write_spec",
]

log = logging.getLogger(__name__)

CDI_KIND = names.CDI_KIND
CDI_VERSION = "0.6.0"
SPEC_NAME = names.CDI_SPEC_NAME
SPEC_MODE = 0o600  # operator-only: see the module's text


def cdi_edits(edits: ContainerEdits) -> dict[str, Any]:
    """A CDI `containerEdits` object (device nodes, env, mounts) of merged edits."""
    result: dict[str, Any] = {
        "deviceNodes": [
            {
                "path": n.path,
                "type": n.kind,
                "major": n.major,
                "minor": n.minor,
                "permissions": n.permissions,
            }
            for n in edits.devices
        ],
    }
    if edits.env:
        result["env"] = [f"{k}={v}" for k, v in edits.env]
    if edits.mounts:
        result["mounts"] = [
            {"hostPath": m.host_path, "containerPath": m.container_path, "options": m.options}
            for m in edits.mounts
        ]
    return result


def render_spec(
    devices: Sequence[Device], driver_paths: DriverPaths, preload: ContainerEdits | None = None
) -> dict[str, Any]:
    """The spec; `preload` (libhcs and the preload file's mounts) goes into every entry."""
    entries = []
    for device in devices:
        edits = cdi_edits(
            merge([vendor_edits([device], driver_paths), preload or ContainerEdits()])
        )
        for name in (device.uuid, f"{device.vendor.value}-{device.index}"):
            entries.append({"name": name, "containerEdits": edits})
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": entries}


def write_spec(
    directory: str,
    devices: Sequence[Device],
    driver_paths: DriverPaths,
    preload: ContainerEdits | None = None,
) -> bool:
    """Write the spec if its content changed; returns whether it wrote. Either way the file
    ends up root-only (a spec left world-readable by an older hcsd is tightened)."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    path = os.path.join(directory, SPEC_NAME)
    text = json.dumps(render_spec(devices, driver_paths, preload), indent=2, sort_keys=True)
    text += "\n"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        pass
    else:
        with os.fdopen(fd, encoding="utf-8") as f:
            if f.read() == text:
                os.fchmod(f.fileno(), SPEC_MODE)
                return False
    write_atomic(OsFileSystem(), path, text.encode())
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, SPEC_MODE)
    finally:
        os.close(fd)
    return True


def _signature(service: NodeService) -> tuple[object, ...]:
    """What the spec depends on: each device's identity and nodes (not usage or health)."""
    return tuple(
        (d.uuid, d.vendor, d.index, d.device_nodes, d.shared_nodes)
        for d in (status.device for status in service.devices())
    )


def publish_spec(
    directory: str,
    service: NodeService,
    driver_paths: DriverPaths,
    preload: ContainerEdits | None = None,
) -> None:
    """Write the spec at start-up; a directory hcsd cannot write is a warning, not a failure
    (the NRI plugin and the other front ends do not need the spec)."""
    try:
        write_spec(directory, [s.device for s in service.devices()], driver_paths, preload)
        log.info("CDI spec in %s is current", directory)
    except OSError as e:
        log.warning("cannot write the CDI spec in %s: %s", directory, e)


async def keep_spec_current(
    directory: str,
    service: NodeService,
    driver_paths: DriverPaths,
    preload: ContainerEdits | None = None,
) -> None:
    """Rewrite the spec when the devices change (hot-plug), not on every allocation."""
    last = _signature(service)
    while True:
        subscription = service.subscribe(send_initial=False)
        try:
            async for event in subscription:
                if event.kind is not EventKind.DEVICE_CHANGED:
                    continue
                current = _signature(service)
                if current == last:
                    continue
                last = current
                try:
                    write_spec(
                        directory, [s.device for s in service.devices()], driver_paths, preload
                    )
                    log.info("CDI spec in %s updated for a device change", directory)
                except OSError as e:
                    log.warning("cannot update the CDI spec in %s: %s", directory, e)
        except WatchOverflow:
            last = ()  # missed events: compare afresh on the next one
