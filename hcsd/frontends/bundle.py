"""Reading an OCI bundle's identity and writing hcsd's edits into its config.json.

CRI runtimes put the pod's identity in annotations (`io.kubernetes.cri.*` from containerd,
`io.kubernetes.pod.*` from CRI-O); pod annotations such as `hcs.io/assignment` reach the
bundle when the runtime passes `hcs.io/*` through (containerd: `pod_annotations`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.runtime.env_merge import merged_env

__all__ = [
    "apply_edits",
    "container_spec",
    "container_user",
    "is_sandbox",
    "load_config",
    "prepare_request",
    "save_config",
]

_NAME_KEYS = ("io.kubernetes.cri.container-name", "io.kubernetes.container.name")
_POD_KEYS = {
    "name": ("io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"),
    "namespace": ("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.pod.namespace"),
    "uid": ("io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid"),
}
DEVICE_MODE = 0o666


def load_config(bundle: str) -> dict[str, Any]:
    with open(os.path.join(bundle, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    if not isinstance(config, dict):
        raise ValueError(f"{bundle}/config.json is not an OCI runtime config")
    return config


def save_config(bundle: str, config: dict[str, Any]) -> None:
    path = os.path.join(bundle, "config.json")
    temporary = path + ".hcs-tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(config, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def _first(annotations: dict[str, str], keys: tuple[str, ...]) -> str:
    return next((annotations[k] for k in keys if k in annotations), "")


def is_sandbox(config: dict[str, Any]) -> bool:
    annotations = config.get("annotations") or {}
    return annotations.get("io.kubernetes.cri.container-type") == "sandbox" or (
        annotations.get("io.kubernetes.cri-o.ContainerType") == "sandbox"
    )


def prepare_request(
    container_id: str, config: dict[str, Any], front_end: str
) -> pb.PrepareContainerRequest:
    annotations = {str(k): str(v) for k, v in (config.get("annotations") or {}).items()}
    pod = pb.PodRef(**{field: _first(annotations, keys) for field, keys in _POD_KEYS.items()})
    return pb.PrepareContainerRequest(
        container_id=container_id,
        container_name=_first(annotations, _NAME_KEYS),
        pod=pod,
        container_annotations=annotations,
        pod_annotations=annotations,
        front_end=front_end,
        user=container_user(config),
    )


def container_user(config: dict[str, Any]) -> pb.ContainerUser | None:
    """Who the container's processes run as on the host: `process.user`, mapped through the
    user namespace's `uidMappings`/`gidMappings` when the config has one; None when that
    cannot be told (no user, an id no mapping covers)."""
    process = config.get("process") if isinstance(config.get("process"), dict) else None
    user = (process or {}).get("user")
    if not isinstance(user, dict):
        return None
    uid, gid = user.get("uid", 0), user.get("gid", 0)
    if not _is_id(uid) or not _is_id(gid):
        return None
    linux = config.get("linux") if isinstance(config.get("linux"), dict) else {}
    namespaces = (linux or {}).get("namespaces") or []
    if any(isinstance(n, dict) and n.get("type") == "user" for n in namespaces):
        host_uid = _mapped(uid, (linux or {}).get("uidMappings"))
        host_gid = _mapped(gid, (linux or {}).get("gidMappings"))
        if host_uid is None or host_gid is None:
            return None
        uid, gid = host_uid, host_gid
    return pb.ContainerUser(uid=uid, gid=gid)


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32 - 1


def _mapped(inside: int, mappings: object) -> int | None:
    """The host id of `inside` under OCI id mappings (containerID, hostID, size)."""
    for m in mappings if isinstance(mappings, list) else []:
        if not isinstance(m, dict) or not all(
            _is_id(m.get(k)) for k in ("containerID", "hostID", "size")
        ):
            continue
        if m["containerID"] <= inside < m["containerID"] + m["size"]:
            host = int(m["hostID"] + inside - m["containerID"])
            return host if _is_id(host) else None
    return None


def container_spec(config: dict[str, Any]) -> pb.ContainerSpec:
    """What the config already holds (devices, mounts, env), for hcsd to check its edits
    against; anything malformed in it counts as absent."""
    linux = config.get("linux") if isinstance(config.get("linux"), dict) else {}
    process = config.get("process") if isinstance(config.get("process"), dict) else {}
    devices = [d for d in (linux or {}).get("devices") or [] if isinstance(d, dict)]
    mounts = [m for m in config.get("mounts") or [] if isinstance(m, dict)]
    return pb.ContainerSpec(
        device_paths=[str(d.get("path", "")) for d in devices],
        mounts=[
            pb.Mount(
                container_path=str(m.get("destination", "")), host_path=str(m.get("source", ""))
            )
            for m in mounts
        ],
        env=[str(e) for e in (process or {}).get("env") or []],
    )


def apply_edits(config: dict[str, Any], edits: pb.PrepareContainerResponse) -> dict[str, Any]:
    """Devices (with their cgroup allow rules), env and mounts; idempotent. Path lists in the
    env (LD_LIBRARY_PATH ...) are prepended to the config's own value, never replace it."""
    process = config.setdefault("process", {})
    current = [str(e) for e in process.get("env", [])]
    ours = merged_env(sorted(edits.env.items()), current)
    env = [e for e in current if e.split("=", 1)[0] not in edits.env]
    process["env"] = env + [f"{k}={v}" for k, v in ours]
    destinations = {m.container_path for m in edits.mounts}
    mounts = [m for m in config.get("mounts", []) if m.get("destination") not in destinations]
    config["mounts"] = mounts + [
        {
            "destination": m.container_path,
            "type": "bind",
            "source": m.host_path,
            "options": list(m.options),
        }
        for m in edits.mounts
    ]
    linux = config.setdefault("linux", {})
    paths = {d.path for d in edits.devices}
    devices = [d for d in linux.get("devices", []) if d.get("path") not in paths]
    linux["devices"] = devices + [
        {
            "path": d.path,
            "type": d.type or "c",
            "major": d.major,
            "minor": d.minor,
            "fileMode": DEVICE_MODE,
            "uid": 0,
            "gid": 0,
        }
        for d in edits.devices
    ]
    rules = linux.setdefault("resources", {}).setdefault("devices", [])
    for d in edits.devices:
        rule = {
            "allow": True,
            "type": d.type or "c",
            "major": d.major,
            "minor": d.minor,
            "access": "rwm",
        }
        if rule not in rules:
            rules.append(rule)
    return config
