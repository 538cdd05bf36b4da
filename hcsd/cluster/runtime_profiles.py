"""RuntimeProfiles: the base image (and env, entrypoint) per vendor that a pod opting in with
`hcs.io/runtime-profile` runs with, read by the extender.

A profile's `spec.runtimes` is a list; for a device, the first entry whose vendor matches
and whose `models` (none: any model) name the device's model wins, so model-specific entries
go first. The extender uses a profile twice:
- at filter, as a constraint like `hcs.io/vendors` (`cover_of` -> `demand.Cover`): the pod
  goes only where some entry has an image for a device;
- at bind, `resolve` turns the entry for each container's devices into the
  `ResolvedRuntime` the signed assignment carries (hcsd.contract.runtime_binding), whose
  image the extender sets on the container.
The CRD's schema (packaging/kubernetes/crds/runtimeprofiles.yaml) already bounds what the
API server stores; `runtime_profile` checks it again through `ResolvedRuntime` (one set of
bounds for the extender and the node), so a profile written before a tighter schema, or
past it, is refused by name rather than signed. Reserved variable names (the CRD refuses
them too) are refused at bind by `resolve`, naming them, for a profile stored before that
rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hcsd.cluster.demand import Cover, DemandError
from hcsd.cluster.planner import expand_models
from hcsd.contract.names import ANNOTATION_RUNTIME_PROFILE, MODEL_NAME
from hcsd.contract.runtime_binding import (
    PROFILE_NAME,
    RESERVED_ENV_PREFIX,
    ResolvedRuntime,
    RuntimeBindingError,
    reserved_env,
)
from hcsd.model import Device, Grant, Vendor
from hcsd.profiles.database import ProfileDatabase

__all__ = [
    "ProfileEntry",
    "RuntimeProfile",
    "cover_of",
    "profile_named",
    "resolve",
    "runtime_profile",
]

MAX_RUNTIMES = 32  # the CRD's spec.runtimes maxItems
MAX_MODELS = 16  # per entry, as in hcs.io/models


@dataclass(frozen=True, slots=True)
class ProfileEntry:
    """One of `spec.runtimes`; `runtime` holds what is signed (its `profile` is the name)."""

    vendor: Vendor
    models: tuple[str, ...]  # as written; empty: any model of the vendor
    runtime: ResolvedRuntime


@dataclass(frozen=True, slots=True)
class RuntimeProfile:
    name: str
    entries: tuple[ProfileEntry, ...]
    resource_version: str = ""  # so a changed profile is a new cover (the filter's caches)


def _strings(raw: Any, what: str, limit: int) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > limit or not all(isinstance(w, str) for w in raw):
        raise ValueError(f"{what} must be a list of at most {limit} strings")
    return tuple(raw)


def _env(raw: Any) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError("env must be a list of {name, value}")
    pairs = []
    for item in raw:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise ValueError("env entries need a name")
        value = item.get("value", "")
        if not isinstance(value, str):
            raise ValueError(f"env {item['name'][:80]!r}: value must be a string")
        pairs.append((item["name"], value))
    return tuple(pairs)


def _entry(name: str, code_mount: str, raw: Any, where: str) -> ProfileEntry:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be an object")
    try:
        vendor = Vendor.parse(str(raw.get("vendor", "")))
        models = _strings(raw.get("models"), "models", MAX_MODELS)
        for model in models:  # the names hcs.io/models takes
            if not MODEL_NAME.fullmatch(model):
                raise ValueError(f"models: {model[:70]!r} is not a model name")
        command, args = raw.get("command"), raw.get("args")
        runtime = ResolvedRuntime(
            profile=name,
            image=str(raw.get("image") or ""),
            env=_env(raw.get("env")),
            command=None if command is None else _strings(command, "command", 64),
            args=None if args is None else _strings(args, "args", 64),
            code_mount=code_mount,
        )
    except (ValueError, RuntimeBindingError) as e:
        raise ValueError(f"{where}: {e}") from e
    return ProfileEntry(vendor, models, runtime)


def runtime_profile(obj: Mapping[str, Any]) -> RuntimeProfile:
    """The profile of a RuntimeProfile object; ValueError (the informer skips it, with the
    reason in its log) when it is malformed."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise ValueError(f"RuntimeProfile {name}: spec must be an object")
    code_mount = spec.get("codeMount") or ""
    if not isinstance(code_mount, str):
        raise ValueError(f"RuntimeProfile {name}: codeMount must be a string")
    runtimes = spec.get("runtimes")
    if not isinstance(runtimes, list) or not 1 <= len(runtimes) <= MAX_RUNTIMES:
        raise ValueError(f"RuntimeProfile {name}: runtimes must list 1..{MAX_RUNTIMES} entries")
    entries = tuple(
        _entry(name, code_mount, raw, f"RuntimeProfile {name} runtimes[{i}]")
        for i, raw in enumerate(runtimes)
    )
    return RuntimeProfile(name, entries, str(meta.get("resourceVersion") or ""))


def profile_named(pod: Mapping[str, Any]) -> str | None:
    """The RuntimeProfile the pod names (`hcs.io/runtime-profile`), None when it names none;
    DemandError when the value cannot be a profile's name."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(ANNOTATION_RUNTIME_PROFILE)
    if raw is None:
        return None
    name = str(raw).strip()
    if not PROFILE_NAME.fullmatch(name) or len(name) > 253:
        raise DemandError(
            f"{ANNOTATION_RUNTIME_PROFILE}: {name[:80]!r} is not a RuntimeProfile name"
        )
    return name


def cover_of(profile: RuntimeProfile, db: ProfileDatabase) -> Cover:
    """The devices the profile has an image for, model aliases expanded as for hcs.io/models
    ("910B" admits "Ascend910B2"...)."""
    return Cover(
        profile.name,
        tuple(
            (e.vendor, expand_models(e.models, db) if e.models else frozenset())
            for e in profile.entries
        ),
    )


def resolve(
    profile: RuntimeProfile,
    cover: Cover,
    grants: Mapping[str, Sequence[Grant]],
    devices: Sequence[Device],
) -> dict[str, ResolvedRuntime] | str:
    """Per container holding grants, the entry for its devices (the first that admits every
    device the container got), or why there is none (a sentence for the pod's Event)."""
    if len(cover.entries) != len(profile.entries):
        return f"runtime profile {profile.name} changed while the pod was being bound"
    by_uuid = {d.uuid: d for d in devices}
    resolved: dict[str, ResolvedRuntime] = {}
    for container, held in grants.items():
        chosen = [by_uuid.get(g.device_uuid) for g in held]
        if not chosen or None in chosen:
            return f"container {container}: its devices are not on the node any more"
        found = None
        for i, (vendor, models) in enumerate(cover.entries):
            if all(
                d is not None and d.vendor is vendor and (not models or d.model.lower() in models)
                for d in chosen
            ):
                found = profile.entries[i].runtime
                break
        if found is None:
            kinds = sorted({f"{d.vendor.value} {d.model}" for d in chosen if d is not None})
            return (
                f"container {container}: runtime profile {profile.name} has no image for "
                f"{', '.join(kinds)} (it has: {cover.describe()})"
            )
        kept = [name for name, _ in found.env if reserved_env(name)]
        if kept:  # the CRD refuses these; a profile stored before that rule may carry them
            return (
                f"container {container}: runtime profile {profile.name} sets "
                f"{', '.join(kept[:8])}, which hcsd sets itself ({RESERVED_ENV_PREFIX}*, "
                "LD_PRELOAD, LD_AUDIT, the vendors' device selection): remove it from the "
                "profile (kubectl edit runtimeprofile "
                f"{profile.name})"
            )
        resolved[container] = found
    return resolved
