"""A container's RuntimeProfile, resolved at bind and signed into its assignment, on the node.

The extender rebinds the container's image to the profile's image for the vendor it chose and
records the profile's env, command and code mount in the assignment (hcsd.contract.
runtime_binding). hcsd applies them only from a verified assignment, and only to the image
they were resolved for: `refusal` (the text from `problem`) stops a container that must
not run with its profile here before anything is held for it, `apply` adds the profile to
hcsd's own edits.

Refused (the container is not created; the text says why):
- the image the runtime is creating the container from is not the profile's image (the pod's
  image changed after bind, or a pod copied the assignment): the profile's env and command
  belong to that image alone;
- the profile replaces the command and the runtime cannot (NRI before v0.10: containerd 1.7,
  2.0, 2.1): the image would run its own entrypoint, not the profile's;
- the front end is not NRI (`hcs-runtime`, `hcs-oci-hook`): they apply no profile;
- the assignment grants the container no device (hcsd applies a profile with its devices);
- the profile names a code mount and the container mounts nothing at or above that path:
  the profile's command would not find the user's code.

Environment precedence (highest first): hcsd's own variables (HCS_*, LD_PRELOAD, LD_AUDIT and
the device selectors hcsd sets or vendor runtimes read, such as CUDA_VISIBLE_DEVICES, always:
the contract's RESERVED_ENV; any other variable hcsd's edits set, such as NCCL_P2P_DISABLE),
then the profile's, then the container's (image and pod spec: NRI carries them merged). A
profile variable hcsd keeps for itself is dropped and named in hcsd's log. Path lists
(env_merge.PATH_LISTS) are joined instead: hcsd's directories, then the profile's, then the
container's own value.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Mapping, Sequence

from hcsd.contract.runtime_binding import ResolvedRuntime, reserved_env
from hcsd.model import FrontEnd
from hcsd.refusals import Reason, Refusal
from hcsd.runtime.container_info import ContainerInfo
from hcsd.runtime.container_mounts import ContainerMount
from hcsd.runtime.edits import ContainerEdits, merge
from hcsd.runtime.env_merge import PATH_LISTS

__all__ = [
    "CODE_DIR_ENV",
    "IMAGE_ANNOTATIONS",
    "apply",
    "image_of",
    "normalized_image",
    "problem",
    "refusal",
    "reserved",
]

log = logging.getLogger(__name__)

CODE_DIR_ENV = "HCS_CODE_DIR"
# The annotation in which the runtime names the image it creates the container from: the name
# the pod spec gave when the kubelet passes it (CRI user_specified_image), else
# the runtime's image record's name. containerd's first, then CRI-O's.
IMAGE_ANNOTATIONS = ("io.kubernetes.cri.image-name", "io.kubernetes.cri-o.ImageName")
_DEFAULT_DOMAIN = "docker.io"


def reserved(name: str) -> bool:
    """A variable no profile may set: hcsd's own, the loader's preload settings and the
    vendors' device selection (hcsd.contract.runtime_binding.RESERVED_ENV)."""
    return reserved_env(name)


def image_of(container_annotations: Mapping[str, str]) -> str:
    """The image the runtime names for the container; "" when it names none."""
    for key in IMAGE_ANNOTATIONS:
        value = container_annotations.get(key, "")
        if value:
            return value
    return ""


def normalized_image(reference: str) -> tuple[str, str, str]:
    """(repository, tag, digest) as a registry client resolves them: `busybox` is
    `docker.io/library/busybox:latest`; a digest alone keeps no tag."""
    name, _, digest = reference.partition("@")
    tag = ""
    colon, slash = name.rfind(":"), name.rfind("/")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    first, separator, rest = name.partition("/")
    if separator and ("." in first or ":" in first or first == "localhost"):
        domain, path = first, rest
    else:
        domain, path = _DEFAULT_DOMAIN, name
    if domain == "index.docker.io":
        domain = _DEFAULT_DOMAIN
    if domain == _DEFAULT_DOMAIN and "/" not in path:
        path = f"library/{path}"
    if not tag and not digest:
        tag = "latest"
    return f"{domain}/{path}", tag, digest


def same_image(expected: str, actual: str) -> bool:
    """Whether `actual` names the image `expected` names; by digest where both have one."""
    want, have = normalized_image(expected), normalized_image(actual)
    if want[2] and have[2]:
        return want[0] == have[0] and want[2] == have[2]
    return want == have


def refusal(
    info: ContainerInfo, runtime: ResolvedRuntime | None, *, granted: bool
) -> Refusal | None:
    """The refusal of a container that cannot run its verified profile here (checked before
    anything is held for it); None when it can, or has no profile."""
    if runtime is None:
        return None
    why = problem(
        runtime,
        granted=granted,
        image=image_of(info.container_annotations),
        mounts=info.mounts,
        argv_adjustable=info.argv_adjustable,
        runtime_name=info.runtime_name,
        nri=info.front_end is FrontEnd.NRI,
    )
    return None if why is None else Refusal(Reason.RUNTIME_PROFILE, f"{info.label}: {why}")


def problem(
    runtime: ResolvedRuntime,
    *,
    granted: bool,
    image: str,
    mounts: Sequence[ContainerMount],
    argv_adjustable: bool,
    runtime_name: str,
    nri: bool,
) -> str | None:
    """Why the container must not run with `runtime` here, or None (see the module's text)."""
    return _node_problem(runtime, granted, argv_adjustable, runtime_name, nri) or (
        _container_problem(runtime, image, mounts)
    )


def _node_problem(
    runtime: ResolvedRuntime, granted: bool, argv_adjustable: bool, runtime_name: str, nri: bool
) -> str | None:
    """What this node (its front end, its runtime, the grants) cannot do for the profile."""
    profile = f"runtime profile {runtime.profile!r}"
    if not nri:
        return (
            f"{profile} is applied only by hcsd's NRI plugin; this front end (hcs-runtime, "
            "hcs-oci-hook) cannot set the profile's env and command: run the pod on a node "
            "whose runtime runs hcsd's NRI plugin"
        )
    if not granted:
        return f"its assignment resolves {profile} but grants it no device"
    if runtime.argv() is not None and not argv_adjustable:
        return (
            f"{profile} replaces the container's command, which {runtime_name or 'the runtime'}"
            " cannot do through NRI (args adjustment needs NRI v0.10: containerd 2.2 or "
            "later); refused rather than running the image's own entrypoint"
        )
    return None


def _container_problem(
    runtime: ResolvedRuntime, image: str, mounts: Sequence[ContainerMount]
) -> str | None:
    """What the container itself lacks for the profile: its image, its code mount."""
    profile = f"runtime profile {runtime.profile!r}"
    if not image:
        return (
            f"{profile} needs the image the container runs, and the runtime names none "
            f"(none of {', '.join(IMAGE_ANNOTATIONS)})"
        )
    if not same_image(runtime.image, image):
        return (
            f"the container's image {image[:200]!r} is not {profile}'s image "
            f"{runtime.image!r} resolved for this device (at bind, or at the claim's prepare "
            "in DRA mode): the profile's env and command go only with its image (the pod's "
            "image changed after it was placed, or the assignment or claim is not this pod's)"
        )
    argv = runtime.argv()
    if argv is not None and not argv[0]:
        return f"{profile}'s command begins with an empty word"
    if runtime.code_mount and not _mounted(runtime.code_mount, mounts):
        return (
            f"{profile} expects the code at {runtime.code_mount}, and the container mounts "
            f"nothing there: mount the code (an image volume or any volume) at "
            f"{runtime.code_mount}"
        )
    return None


def _mounted(path: str, mounts: Sequence[ContainerMount]) -> bool:
    """Whether a mount lies at `path` or at a directory above it."""
    wanted = posixpath.normpath(path)
    for mount in mounts:
        destination = posixpath.normpath(mount.destination or "/")
        if wanted == destination or wanted.startswith(destination.rstrip("/") + "/"):
            return True
    return False


def apply(edits: ContainerEdits, runtime: ResolvedRuntime, label: str) -> ContainerEdits:
    """hcsd's `edits` with the profile's env, argv and HCS_CODE_DIR (precedence in the
    module's text); a profile variable hcsd keeps is dropped and named in the log."""
    ours = {name for name, _ in edits.env}
    env, dropped = [], []
    for name, value in runtime.env:
        if reserved(name) or (name in ours and name not in PATH_LISTS):
            dropped.append(name)
        else:
            env.append((name, value))
    if runtime.code_mount:
        env.append((CODE_DIR_ENV, posixpath.normpath(runtime.code_mount)))
    if dropped:
        log.warning(
            "%s: runtime profile %r: not setting %s: hcsd keeps these for itself",
            label,
            runtime.profile,
            ", ".join(dropped),
        )
    argv = runtime.argv()
    log.info(
        "%s: applying runtime profile %r (image %s): %d variable(s), %s",
        label,
        runtime.profile,
        runtime.image,
        len(env),
        "the image's command" if argv is None else f"command {list(argv)[:8]!r}",
    )
    return merge([edits, ContainerEdits(env=tuple(env), argv=argv)])
