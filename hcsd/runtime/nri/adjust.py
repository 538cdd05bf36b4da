"""Container edits → NRI's ContainerAdjustment, and NRI's pod/container → ContainerInfo."""

from __future__ import annotations

from collections.abc import Sequence

from hcsd.model import FrontEnd, PodRef
from hcsd.runtime.container_files import ContainerUser
from hcsd.runtime.container_info import ContainerInfo
from hcsd.runtime.container_mounts import ContainerMount
from hcsd.runtime.edits import ContainerEdits
from hcsd.runtime.env_merge import merged_env
from hcsd.runtime.nri.v1alpha1 import api_pb2 as api
from hcsd.runtime.presence import ContainerView, RunningContainer

__all__ = [
    "adjustment",
    "container_info",
    "container_mounts",
    "container_user",
    "running_container",
]

DEVICE_MODE = 0o666


def adjustment(edits: ContainerEdits, container_env: Sequence[str] = ()) -> api.ContainerAdjustment:
    """The adjustment for `edits`; path lists in their env are prepended to the container's
    own value (`container_env`, from the request), as an NRI env adjustment replaces it.
    A runtime profile's argv becomes `args` (the caller checked that the runtime applies it)."""
    result = api.ContainerAdjustment()
    if edits.argv is not None:
        result.args.extend(edits.argv)
    for node in edits.devices:
        result.linux.devices.append(
            api.LinuxDevice(
                path=node.path,
                type=node.kind,
                major=node.major,
                minor=node.minor,
                file_mode=api.OptionalFileMode(value=DEVICE_MODE),
            )
        )
    for mount in edits.mounts:
        result.mounts.append(
            api.Mount(
                destination=mount.container_path,
                type="bind",
                source=mount.host_path,
                options=mount.options,
            )
        )
    for key, value in merged_env(edits.env, container_env):
        result.env.append(api.KeyValue(key=key, value=value))
    for key, value in edits.annotations:
        result.annotations[key] = value
    return result


def container_info(
    pod: api.PodSandbox,
    container: api.Container,
    argv_adjustable: bool = False,
    runtime_name: str = "",
) -> ContainerInfo:
    """What the injector needs of an NRI request; `argv_adjustable` and `runtime_name` are
    what the session's Configure said about the runtime."""
    return ContainerInfo(
        container_id=container.id,
        container_name=container.name,
        pod=PodRef(namespace=pod.namespace, name=pod.name, uid=pod.uid),
        container_annotations=dict(container.annotations),
        pod_annotations=dict(pod.annotations),
        front_end=FrontEnd.NRI,
        user=container_user(container),
        mounts=container_mounts(container),
        argv_adjustable=argv_adjustable,
        runtime_name=runtime_name,
    )


def container_mounts(container: api.Container) -> tuple[ContainerMount, ...]:
    """All the container's mounts: binds of host paths (volumes, hostPath, /etc/hosts …) and
    the others (tmpfs, proc …), which may cover a host directory below or above them."""
    return tuple(
        ContainerMount(
            m.destination,
            m.source,
            bind=(m.type == "bind" or "bind" in m.options or "rbind" in m.options)
            and m.source.startswith("/"),
            kind=m.type or "untyped",
        )
        for m in container.mounts
    )


def container_user(container: api.Container) -> ContainerUser | None:
    """The host uid and gid the container runs as; None when the request does not tell: NRI
    before v0.12 carries no user, and in a user namespace the spec's ids are the container's,
    while NRI does not carry the mapping to the host's."""
    if not container.HasField("user"):
        return None
    if any(ns.type == "user" for ns in container.linux.namespaces):
        return None
    return ContainerUser(container.user.uid, container.user.gid)


def running_container(pod: api.PodSandbox, container: api.Container) -> RunningContainer:
    """A container from Synchronize, with the mounts and env of its spec as the runtime has it."""
    return RunningContainer(
        container_info(pod, container),
        ContainerView.of(
            mounts=((m.destination, m.source) for m in container.mounts), env=container.env
        ),
    )
