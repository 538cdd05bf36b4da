"""Container edits as plain data: device nodes, environment, mounts, and a runtime profile's
argv (hcsd/runtime/runtime_profile.py).

Each source (the vendor's devices, driver mounts, the libhcs preload, comm settings) returns a
ContainerEdits; `merge` combines them with duplicates removed and a stable order. The same
merged edits become the NRI adjustment, the CDI spec entries and the runc-wrapper patch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from hcsd.model import DeviceNode
from hcsd.runtime.env_merge import PATH_LISTS, join_paths

__all__ = ["ContainerEdits", "MountEdit", "merge"]


@dataclass(frozen=True, slots=True)
class MountEdit:
    host_path: str
    container_path: str
    read_only: bool = True

    @property
    def options(self) -> list[str]:
        return ["bind", "ro" if self.read_only else "rw", "nosuid", "nodev"]


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    devices: tuple[DeviceNode, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    mounts: tuple[MountEdit, ...] = ()
    annotations: tuple[tuple[str, str], ...] = field(default=())
    # The container's whole command line, or None to keep the runtime's (only NRI sets it)
    argv: tuple[str, ...] | None = None

    @property
    def empty(self) -> bool:
        return not (
            self.devices or self.env or self.mounts or self.annotations or self.argv is not None
        )


def merge(parts: Iterable[ContainerEdits]) -> ContainerEdits:
    """One set of edits; for env and mounts a later part wins over an earlier one, except
    that path lists (`env_merge.PATH_LISTS`) are joined, the earlier part's elements first;
    the last part that sets an argv gives it."""
    devices: dict[str, DeviceNode] = {}
    argv: tuple[str, ...] | None = None
    env: dict[str, str] = {}
    mounts: dict[str, MountEdit] = {}
    annotations: dict[str, str] = {}
    for part in parts:
        for node in part.devices:
            devices.setdefault(node.path, node)
        for key, value in part.env:
            env[key] = join_paths(env[key], value) if key in PATH_LISTS and key in env else value
        for mount in part.mounts:
            mounts[mount.container_path] = mount
        annotations.update(part.annotations)
        argv = part.argv if part.argv is not None else argv
    return ContainerEdits(
        devices=tuple(devices[p] for p in sorted(devices)),
        env=tuple(sorted(env.items())),
        mounts=tuple(mounts[p] for p in sorted(mounts)),
        annotations=tuple(sorted(annotations.items())),
        argv=argv,
    )
