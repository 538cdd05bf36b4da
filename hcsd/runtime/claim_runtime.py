"""DRA mode's runtime profiles on the node: the profile the kubelet plugin resolved for a
claim, recorded with the claim and applied by the NRI plugin to the claim's containers.

In DRA mode no signed assignment reaches the node. The trusted caller is the kubelet plugin
(in hcs-syncer, with the cluster credentials): it reads the claim's reserving pod and the
RuntimeProfile itself (never the pod's annotations for the resolved values), resolves the
entry for the allocated devices and sends it with PrepareClaim, over hcsd's local API socket,
which only root reaches. hcsd writes it to `runtime.json` in the claim's own directory
(`<run_dir>/claims/claim-<uid>/`, beside its quota file), so that it outlives a restart of
hcsd as the claim does.

When the runtime creates a container, the NRI plugin knows it belongs to a claim by the
claim's quota file among its mounts (claim_links.ClaimLinks.claim_of: only the claim's CDI
spec, hcsd's, root's, mounts it; a pod cannot name a host path under hcsd's run directory
without the hostPath privilege). The record then gives every
container of the pod reserving the claim (its uid) that uses the claim the resolved profile
(one entry for the claim's devices, as the profile gate chose one vendor for the pod):
checked (`runtime_profile.refusal`: the image must be the resolved one, the code mount
present, args adjustable) and
applied (`runtime_profile.apply`) as from a verified assignment. Variables the claim's CDI
spec sets (the vendor's selection env, HCS_CONFIG) stay hcsd's: a profile's are dropped.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from typing import Any

from hcsd.contract.runtime_binding import (
    ResolvedRuntime,
    RuntimeBindingError,
    dump,
    load,
)
from hcsd.fs import OsFileSystem, write_atomic

__all__ = ["RUNTIME_FILE", "ClaimRuntime", "read", "write"]

log = logging.getLogger(__name__)

RUNTIME_FILE = "runtime.json"
MAX_BYTES = 64 * 1024  # as an assignment


@dataclass(frozen=True, slots=True)
class ClaimRuntime:
    pod_uid: str  # the pod reserving the claim
    runtime: ResolvedRuntime  # for every container of that pod using the claim
    hcsd_env: frozenset[str] = frozenset()  # the names the claim's CDI edits set

    def for_container(self, pod_uid: str, label: str) -> ResolvedRuntime | None:
        """The profile for a container of `pod_uid`, with the variables hcsd's edits set
        left out (named in the log); None for another pod's container."""
        if pod_uid != self.pod_uid:
            return None
        found = self.runtime
        kept = tuple((k, v) for k, v in found.env if k not in self.hcsd_env)
        if len(kept) != len(found.env):
            dropped = sorted({k for k, _ in found.env} & self.hcsd_env)
            log.warning(
                "%s: runtime profile %r: not setting %s: the claim's devices set these",
                label,
                found.profile,
                ", ".join(dropped),
            )
        return replace(found, env=kept)


def write(directory: str, runtime: ClaimRuntime) -> None:
    """Record `runtime` in the claim's directory (atomically: a restart reads all or none)."""
    body: dict[str, Any] = {
        "pod_uid": runtime.pod_uid,
        "runtime": dump(runtime.runtime),
        "hcsd_env": sorted(runtime.hcsd_env),
    }
    text = json.dumps(body, sort_keys=True).encode()
    write_atomic(OsFileSystem(), os.path.join(directory, RUNTIME_FILE), text, mode=0o600)


def read(directory: str) -> ClaimRuntime | None:
    """The claim's recorded profile; None when it has none. RuntimeBindingError for a record
    that cannot be read (the container is refused: it was meant to run with a profile)."""
    path = os.path.join(directory, RUNTIME_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise RuntimeBindingError(f"failed to open the claim's runtime profile: {e}") from e
    with os.fdopen(fd, "rb") as f:
        text = f.read(MAX_BYTES + 1)
    try:
        if len(text) > MAX_BYTES:
            raise ValueError(f"larger than {MAX_BYTES} bytes")
        body = json.loads(text)
        return ClaimRuntime(
            pod_uid=str(body["pod_uid"]),
            runtime=load(body["runtime"]),
            hcsd_env=frozenset(str(n) for n in body.get("hcsd_env") or ()),
        )
    except (ValueError, KeyError, TypeError) as e:
        raise RuntimeBindingError(f"the claim's runtime profile record is malformed: {e}") from e
