"""The DRA mode's half of hcs-syncer: keeps its node's ResourceSlice equal to hcsd's devices.

The ComputeNode's write discipline: the slice as last written (or read) is remembered, and a
pass writes only when what it would write offers something else (a device added or gone, an
attribute, a capacity, a taint). Every write is conditional (the stored object's
resourceVersion goes with it) and bumps the pool's generation, which is how kube-scheduler
tells a pool's newest slices. After any API error the memory is dropped and the next pass
reads the slice back first (`forget`), so an edit by someone else is repaired, not
overwritten blindly.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.dra_slices import (
    API_VERSION,
    resource_slice,
    same_devices,
    slice_name,
    slice_spec,
)
from hcsd.cluster.kube import Kube, KubeError, paths_for

__all__ = ["SLICES", "SlicePublisher"]

log = logging.getLogger(__name__)

SLICES = "resourceslices"


class SlicePublisher:
    """`publish(devices)` once per syncer pass; `forget()` after an API error or to resync."""

    def __init__(self, kube: Kube, node: str, *, taint_effect: str = "NoSchedule") -> None:
        self.kube = kube
        self.node = node
        self.taint_effect = taint_effect
        self.writes: Counter[str] = Counter()  # create, update: what it cost
        self._stored: dict[str, Any] | None = None
        self._read = False  # whether _stored is what the API server holds (None: no slice)

    @property
    def path(self) -> str:
        return paths_for(API_VERSION, SLICES, name=slice_name(self.node))

    def forget(self) -> None:
        self._stored = None
        self._read = False

    def publish(self, devices: Sequence[pb.Device]) -> bool:
        """Write the slice if it does not offer `devices` as they are now; True if written."""
        if not self._read:
            try:
                self._stored = self.kube.get(self.path)
            except KubeError as e:
                if not e.not_found:
                    raise
                self._stored = None
            self._read = True
        stored = (self._stored or {}).get("spec")
        generation = int(((stored or {}).get("pool") or {}).get("generation") or 0)
        spec = slice_spec(
            self.node,
            devices,
            generation=generation,
            taint_effect=self.taint_effect,
            stored=stored,
        )
        if same_devices(stored, spec):
            return False
        spec["pool"]["generation"] = generation + 1
        if self._stored is None:
            self._stored = self.kube.create(
                self.path.rsplit("/", 1)[0], resource_slice(self.node, spec)
            )
            self.writes["create"] += 1
        else:  # carries metadata.resourceVersion: refused (409) if it changed since read
            self._stored = self.kube.replace(self.path, {**self._stored, "spec": spec})
            self.writes["update"] += 1
        tainted = sorted(d["name"] for d in spec["devices"] if d.get("taints"))
        log.info(
            "ResourceSlice of %s written (generation %d, %d devices%s)",
            self.node,
            generation + 1,
            len(spec["devices"]),
            f", tainted: {', '.join(tainted)}" if tainted else "",
        )
        return True
