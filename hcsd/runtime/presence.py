"""Whether a container really got hcsd's edits, judged from what its runtime reports.

A runtime can create a container without hcsd's edits although hcsd decided them: the NRI
runtime gives up on a plugin that misses its request timeout and creates the container anyway,
a container created while hcsd was not registered gets nothing, and a runtime without NRI
(podman, CRI-O with CDI) injects devices but never libhcs. Two readers of a container's final
spec use this module: the NRI plugin at Synchronize (the runtime lists every container with its
mounts and env) and `hcs-oci-hook` at createRuntime (the OCI config). Pure functions over plain
data; the caller decides what to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hcsd.contract import paths
from hcsd.contract.assignment import ANNOTATION, AssignmentError, parse
from hcsd.runtime.annotations import requested_keys
from hcsd.runtime.edits import ContainerEdits

if TYPE_CHECKING:  # the injector imports this module
    from hcsd.runtime.container_info import ContainerInfo

__all__ = ["ContainerView", "RunningContainer", "asks_for_devices", "missing_edits"]

# Where hcsd's quota edits land in a container: libhcs, the preload file, the quota file and
# the usage region (two single-file mounts). Driver mounts are not among them: a vendor's CDI
# spec may supply those.
_QUOTA_DESTINATIONS = (
    paths.LIBHCS_IN_CONTAINER,
    paths.PRELOAD_FILE,
    paths.CONTAINER_QUOTA_FILE,
    paths.CONTAINER_REGION_FILE,
)
_QUOTA_ENV = ("HCS_CONFIG",)


@dataclass(frozen=True, slots=True)
class ContainerView:
    """What a container's final spec holds: device paths, mounts (destination -> source), env."""

    device_paths: frozenset[str] = frozenset()
    mounts: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        *,
        device_paths: Iterable[str] = (),
        mounts: Iterable[tuple[str, str]] = (),
        env: Iterable[str] = (),
    ) -> ContainerView:
        """From runtime data: mounts as (destination, source), env as `KEY=VALUE` strings."""
        variables = dict(e.partition("=")[::2] for e in env)
        return cls(frozenset(device_paths), dict(mounts), variables)

    def has_quota_edits(self, preload_file: str, quota_file: str) -> bool:
        """Whether hcsd's preload file is mounted over /etc/ld.so.preload and the container's
        own quota file at /run/hcs/quota.conf: present in every container hcsd's edits
        reached, and mounts no tenant sets up without host paths. (The CDI spec's entries
        have the preload file and no quota file: a container of those has no quota.)"""
        return (
            bool(quota_file)
            and self.mounts.get(paths.PRELOAD_FILE) == preload_file
            and self.mounts.get(paths.CONTAINER_QUOTA_FILE) == quota_file
        )


@dataclass(frozen=True, slots=True)
class RunningContainer:
    """A container the runtime reports as existing (created or running), with its spec."""

    info: ContainerInfo
    view: ContainerView


def missing_edits(edits: ContainerEdits, view: ContainerView) -> list[str]:
    """hcsd's devices and quota edits that the container's spec lacks (empty: all there).

    A quota mount counts only from hcsd's own source: a mount of something else at the same
    place gives the container no quota.
    """
    missing = sorted(d.path for d in edits.devices if d.path not in view.device_paths)
    missing += [
        f"mount {m.container_path}"
        for m in edits.mounts
        if m.container_path in _QUOTA_DESTINATIONS
        and view.mounts.get(m.container_path) != m.host_path
    ]
    missing += [
        f"env {key}" for key, value in edits.env if key in _QUOTA_ENV and view.env.get(key) != value
    ]
    return missing


def asks_for_devices(info: ContainerInfo) -> bool:
    """Whether the container's annotations ask hcsd for devices, read as the injector would
    (the assignment's entry for this container, else local `hcs.io/*` requests), unverified:
    this only decides whether a container without edits is worth a warning."""
    text = info.pod_annotations.get(ANNOTATION)
    if text is not None:
        try:
            return bool(parse(text).containers.get(info.container_name))
        except AssignmentError:
            return True  # unreadable: the injector would have refused it, not left it alone
    return bool(requested_keys(info.container_annotations, info.pod_annotations))
