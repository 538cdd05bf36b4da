"""A RuntimeProfile as resolved for one container at bind: the part of the signed assignment
that says which base image the extender set and what the node must add to the container.

The extender picks the profile's entry for the vendor (and model) it chose, sets the
container's `image` (the one pod field Kubernetes lets it change) and records the rest here;
hcsd applies `env`, `command` and `args` through NRI only from a verified assignment, so a
tenant who writes the same words into an annotation of their own gets nothing.

In the assignment's JSON, under "runtime", per container name:
  {"profile": "pytorch-2.5", "image": "nvcr.io/nvidia/pytorch:24.10-py3",
   "env": [["NAME", "value"], ...], "command": ["python3", "-m", "serve"],
   "args": ["--port", "8000"], "code_mount": "/workspace"}
`command` and `args` are absent when the profile does not override them. When `command` is
given, the container's whole argv becomes `command + args`; `args` alone is refused (the node
sees the argv the runtime resolved, not the image's ENTRYPOINT it would have to keep).
Every failure is a `RuntimeBindingError` whose message says which field is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_ARGV",
    "MAX_ENV",
    "PROFILE_NAME",
    "RESERVED_ENV",
    "RESERVED_ENV_PREFIX",
    "ResolvedRuntime",
    "RuntimeBindingError",
    "dump",
    "load",
    "reserved_env",
]

#: A RuntimeProfile's name: a DNS subdomain, as any cluster-scoped object's.
PROFILE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_ENV = 64
MAX_ARGV = 64
MAX_TEXT = 4096  # one env value or argv word
MAX_IMAGE = 512
MAX_PATH = 1024

# The variables hcsd sets itself in a container, which no profile may set: the loader's
# preload settings (libhcs), the vendors' device selection (hcsd.runtime.vendors.
# VENDOR_RUNTIME: the node sets them to the devices granted), the other device selectors the
# vendors' runtimes and hooks read (ROCm/DTK's ROCR_VISIBLE_DEVICES and GPU_DEVICE_ORDINAL,
# NVIDIA's NVIDIA_MIG_MONITOR_DEVICES, Ascend Docker Runtime's ASCEND_RUNTIME_OPTIONS: a
# profile setting one would widen or narrow the devices granted) and every HCS_* variable.
# NVIDIA_DRIVER_CAPABILITIES is left to profiles: it picks which driver libraries the NVIDIA
# runtime mounts (compute, utility, video...), not which devices. The
# node drops them from a profile; the extender refuses to bind a profile carrying one; the
# RuntimeProfile CRD refuses them (its CEL rule on env items is checked against this set by
# tests/unit/test_manifests.py).
RESERVED_ENV = frozenset({
    "LD_PRELOAD", "LD_AUDIT",
    "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
    "ASCEND_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
    "CAMBRICON_VISIBLE_DEVICES", "MLU_VISIBLE_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES", "ASCEND_RUNTIME_OPTIONS",
})  # fmt: skip
RESERVED_ENV_PREFIX = "HCS_"


def reserved_env(name: str) -> bool:
    """Whether `name` is a variable hcsd keeps for itself (RESERVED_ENV, HCS_*)."""
    return name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIX)


class RuntimeBindingError(ValueError):
    """The resolved runtime is malformed: a wrong type, a bad name, too long, args without
    command."""


@dataclass(frozen=True, slots=True)
class ResolvedRuntime:
    """One container's resolved profile (see the module's docstring for the JSON)."""

    profile: str
    image: str
    env: tuple[tuple[str, str], ...] = ()
    command: tuple[str, ...] | None = None
    args: tuple[str, ...] | None = None
    code_mount: str = ""

    def __post_init__(self) -> None:
        _check(self)

    def argv(self) -> tuple[str, ...] | None:
        """The container's whole command line, or None to keep what the runtime resolved."""
        if self.command is None:
            return None
        return self.command + (self.args or ())


def _text(value: Any, what: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str):
        raise RuntimeBindingError(f"runtime {what} must be a string")
    if len(value) > limit or "\0" in value:
        raise RuntimeBindingError(f"runtime {what} is longer than {limit} or holds a NUL")
    return value


def _words(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or len(value) > MAX_ARGV:
        raise RuntimeBindingError(f"runtime {what} must be a list of at most {MAX_ARGV} strings")
    return tuple(_text(word, what) for word in value)


def _check(runtime: ResolvedRuntime) -> None:
    if not PROFILE_NAME.fullmatch(runtime.profile) or len(runtime.profile) > 253:
        raise RuntimeBindingError(f"runtime profile {runtime.profile[:80]!r} is not a name")
    if (
        not runtime.image
        or len(runtime.image) > MAX_IMAGE
        or any(c.isspace() for c in runtime.image)
    ):
        raise RuntimeBindingError(f"runtime image {runtime.image[:80]!r} is not an image name")
    if len(runtime.env) > MAX_ENV:
        raise RuntimeBindingError(f"runtime env has more than {MAX_ENV} variables")
    names = [name for name, _ in runtime.env]
    for name in names:
        if not ENV_NAME.fullmatch(name):
            raise RuntimeBindingError(f"runtime env name {name[:80]!r} is not a variable name")
    if len(set(names)) != len(names):
        raise RuntimeBindingError("runtime env names a variable twice")
    if runtime.args is not None and runtime.command is None:
        raise RuntimeBindingError("runtime args need a command (the image's entrypoint is unknown)")
    if runtime.code_mount and not runtime.code_mount.startswith("/"):
        raise RuntimeBindingError(f"runtime code_mount {runtime.code_mount[:80]!r} is not absolute")
    _text(runtime.code_mount, "code_mount", MAX_PATH)


def dump(runtime: ResolvedRuntime) -> dict[str, Any]:
    """The JSON object for one container (what the signature covers)."""
    body: dict[str, Any] = {
        "profile": runtime.profile,
        "image": runtime.image,
        "env": [[name, value] for name, value in runtime.env],
        "code_mount": runtime.code_mount,
    }
    if runtime.command is not None:
        body["command"] = list(runtime.command)
    if runtime.args is not None:
        body["args"] = list(runtime.args)
    return body


def _pair(raw: Any) -> tuple[str, str]:
    if not isinstance(raw, list | tuple) or len(raw) != 2:
        raise RuntimeBindingError("runtime env entries must be [name, value] pairs")
    return _text(raw[0], "env name", 128), _text(raw[1], "env value")


def load(raw: Any) -> ResolvedRuntime:
    """One container's resolved runtime from its JSON object."""
    if not isinstance(raw, Mapping):
        raise RuntimeBindingError("runtime must be an object per container")
    env = raw.get("env", [])
    if not isinstance(env, list) or len(env) > MAX_ENV:
        raise RuntimeBindingError(f"runtime env must be a list of at most {MAX_ENV} pairs")
    command = raw.get("command")
    args = raw.get("args")
    return ResolvedRuntime(
        profile=_text(raw.get("profile"), "profile", 253),
        image=_text(raw.get("image"), "image", MAX_IMAGE),
        env=tuple(_pair(pair) for pair in env),
        command=None if command is None else _words(command, "command"),
        args=None if args is None else _words(args, "args"),
        code_mount=_text(raw.get("code_mount", ""), "code_mount", MAX_PATH),
    )


def load_all(raw: Any, containers: Sequence[str]) -> dict[str, ResolvedRuntime]:
    """The "runtime" object of an assignment: only for containers the assignment names."""
    if not isinstance(raw, Mapping):
        raise RuntimeBindingError("runtime must be an object keyed by container name")
    unknown = sorted(set(raw) - set(containers))
    if unknown:
        raise RuntimeBindingError(f"runtime names containers without grants: {unknown[:4]}")
    return {str(name): load(value) for name, value in raw.items()}
