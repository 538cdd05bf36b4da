"""Reusing a vendor's own CDI spec for driver edits (e.g. `nvidia-ctk cdi generate`).

The vendor's generator knows the exact driver libraries, binaries and their container paths for
the installed driver version; where its spec exists, its top-level `containerEdits` (mounts and
env) replace hcsd's configured driver directories. Device nodes still come from discovery, so
the container gets only its assigned devices. Parsed specs are cached by modification time.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import yaml

from hcsd.model import Vendor
from hcsd.runtime.edits import ContainerEdits, MountEdit

__all__ = ["VENDOR_SPEC_PATTERNS", "vendor_spec_edits"]

log = logging.getLogger(__name__)

VENDOR_SPEC_PATTERNS: dict[Vendor, tuple[str, ...]] = {
    Vendor.NVIDIA: (
        "/etc/cdi/nvidia*.yaml",
        "/etc/cdi/nvidia*.json",
        "/var/run/cdi/nvidia*.yaml",
        "/var/run/cdi/nvidia*.json",
    ),
}
_cache: dict[str, tuple[float, ContainerEdits | None]] = {}


def vendor_spec_edits(
    vendor: Vendor, patterns: Sequence[str] | None = None
) -> ContainerEdits | None:
    """Driver edits from the vendor's CDI spec, or None when there is none (or it is unusable)."""
    for pattern in patterns if patterns is not None else VENDOR_SPEC_PATTERNS.get(vendor, ()):
        for path in sorted(glob.glob(pattern)):
            try:
                mtime = os.stat(path).st_mtime
            except OSError:
                continue
            cached = _cache.get(path)
            if cached is None or cached[0] != mtime:
                cached = (mtime, _load(path))
                _cache[path] = cached
            if cached[1] is not None:
                return cached[1]
    return None


def _load(path: str) -> ContainerEdits | None:
    try:
        with open(path, encoding="utf-8") as f:
            data: Any = json.load(f) if path.endswith(".json") else yaml.safe_load(f)
        edits = data.get("containerEdits") or {}
        mounts = tuple(
            MountEdit(
                host_path=str(m["hostPath"]),
                container_path=str(m["containerPath"]),
                read_only="rw" not in (m.get("options") or []),
            )
            for m in edits.get("mounts") or []
        )
        env = tuple(
            (key, value)
            for key, _, value in (str(e).partition("=") for e in edits.get("env") or [])
            if key
        )
    except (OSError, ValueError, yaml.YAMLError, AttributeError, KeyError, TypeError) as e:
        log.warning("ignoring the vendor CDI spec %s: %s", path, e)
        return None
    log.info("using the driver edits of the vendor CDI spec %s (%d mounts)", path, len(mounts))
    return ContainerEdits(mounts=mounts, env=env)
