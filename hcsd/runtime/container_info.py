"""What a front end tells the injector about a container about to be created.

The NRI plugin fills every field from the CreateContainer request and the session's Configure;
the runc wrapper and the OCI hook (through the local API) leave the runtime's own fields empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hcsd.model import FrontEnd, PodRef
from hcsd.runtime.container_files import ContainerUser
from hcsd.runtime.container_mounts import ContainerMount

__all__ = ["ContainerInfo"]


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    container_id: str
    container_name: str
    pod: PodRef
    container_annotations: Mapping[str, str] = field(default_factory=dict)
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    front_end: FrontEnd = FrontEnd.UNKNOWN  # who asks: recorded with the allocation
    # Who its processes run as on the host, when the runtime says (owner of its usage region)
    user: ContainerUser | None = None
    # Its mounts (NRI says; the other front ends leave it empty): checkpoint resume
    mounts: tuple[ContainerMount, ...] = ()
    # NRI: whether the runtime applies an argv adjustment (NRI v0.10+), and its name/version
    argv_adjustable: bool = False
    runtime_name: str = ""

    @property
    def label(self) -> str:
        """`ns/pod/container` as log lines about a container start (or the id alone)."""
        if self.pod.name:
            return f"{self.pod}/{self.container_name or self.container_id[:12]}"
        return self.container_id
