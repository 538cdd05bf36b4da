"""hcs-syncer: mirrors one node's hcsd into its ComputeNode and keeps its heartbeat Lease.

What it writes, and when (the API server is shared by every node, so writes are the cost):
- the ComputeNode's spec when the inventory changes (hot-plug, a new fingerprint);
- its status when usage or health changes, never on a timer; bursts of hcsd events within
  `settle` seconds become one write;
- the Lease `hcs-node-<node>` every `renew` seconds while hcsd answers: the heartbeat the
  extender checks. A dead hcsd stops the heartbeat, so the node stops getting pods.
What was last written is remembered; after an API error it is forgotten, and the next pass
reads the object back and writes only what differs (a full resync). "Differs" also knows what
the API server keeps of a write: a CRD older than this syncer prunes the fields it does not
list, so the object never equals the body sent; a part whose body is unchanged and whose
stored copy is what the server kept of it is not written again, and the pruned fields are
logged once (apply the CRDs before upgrading the syncers). Failures back off
exponentially with jitter, so an API server outage is not met with a storm on its return.
In DRA mode (`mode="dra"`) it also keeps the node's ResourceSlice (slice_publisher.py), under
the same discipline, and labels the ComputeNode `hcs.io/mode: dra`: the extender then offers
none of the node's devices, which kube-scheduler allocates through the slice instead.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hcsd.api.client import ApiError, Client
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.key_fetch import KeyFetcher
from hcsd.cluster.kube import Kube, KubeError, lease_object, paths_for
from hcsd.cluster.objects import compute_node, node_spec, node_status
from hcsd.cluster.slice_publisher import SlicePublisher
from hcsd.cluster.timefmt import micro_time, rfc3339
from hcsd.contract import paths
from hcsd.contract.dra import MODE_DRA, MODE_EXTENDER, MODE_LABEL
from hcsd.contract.names import API_VERSION, COMPUTE_NODES, NAMESPACE, NODE_LEASE_PREFIX

__all__ = ["SYNCER_TOKEN_FILE", "Syncer", "SyncerSettings"]

log = logging.getLogger(__name__)

# The DaemonSet's projected token for the node-keys endpoint (audience hcs-node-keys)
SYNCER_TOKEN_FILE = "/var/run/secrets/hcs/token"  # noqa: S105 - a path, not a secret


@dataclass(frozen=True, slots=True)
class SyncerSettings:
    node_name: str
    socket_path: str = paths.SOCKET
    namespace: str = NAMESPACE
    lease_seconds: int = 40  # the extender treats a node as gone after this
    renew: float = 10.0  # 6 Lease writes a minute: the steady-state cost
    settle: float = 0.2  # coalesce a burst of hcsd events into one status write
    resync: float = 300.0  # re-read the object (a read, no write unless it differs)
    backoff_max: float = 30.0
    keys_url: str = ""  # the extender's node-keys endpoint; empty: hcsd's keys come otherwise
    keys_ca: str = ""
    token_file: str = SYNCER_TOKEN_FILE
    keys_every: float = 60.0
    mode: str = MODE_EXTENDER  # dra: publish a ResourceSlice; the extender offers nothing here
    device_taint_effect: str = "NoSchedule"  # on unhealthy devices in the slice; or NoExecute
    # DRA mode: read the ResourceSlice back this often (one GET): kubelet deletes a node's
    # slices when it restarts or its plugin goes, and nothing else would bring it back
    # before the resync.
    slice_check: float = 30.0


class Syncer:
    """Run with `run()` in the foreground; `stop()` from a signal handler or another thread."""

    def __init__(
        self,
        settings: SyncerSettings,
        kube: Kube,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.clock = clock
        self.writes: Counter[str] = Counter()  # spec, status, create, lease: what it cost
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._dirty = True
        self._written: dict[str, Any] | None = None  # the object as last written or read
        # spec/status: (the body last sent, what the server kept of it); kept across resyncs
        self._sent: dict[str, tuple[Any, Any]] = {}
        self._pruned_logged: set[str] = set()
        self._lease: dict[str, Any] | None = None
        self._hcsd_up = False
        self._failures = 0
        self._devices: list[pb.Device] = []  # as last read from hcsd
        self.slices = (
            SlicePublisher(kube, settings.node_name, taint_effect=settings.device_taint_effect)
            if settings.mode == MODE_DRA
            else None
        )
        self.synced = threading.Event()  # set after each pass that left the object current
        self.keys = (
            KeyFetcher(
                settings.keys_url,
                settings.token_file,
                settings.socket_path,
                ca=settings.keys_ca,
                every=settings.keys_every,
            )
            if settings.keys_url
            else None
        )

    @property
    def node_path(self) -> str:
        return paths_for(API_VERSION, COMPUTE_NODES, name=self.settings.node_name)

    @property
    def lease_path(self) -> str:
        name = NODE_LEASE_PREFIX + self.settings.node_name
        return paths_for("coordination.k8s.io/v1", "leases", self.settings.namespace, name)

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def run(self) -> None:
        watcher = threading.Thread(target=self._watch_hcsd, name="hcsd-watch", daemon=True)
        watcher.start()
        if self.keys is not None:  # its own thread: a slow extender never delays the Lease
            threading.Thread(target=self._fetch_keys, name="node-keys", daemon=True).start()
        next_renew = 0.0
        next_resync = time.monotonic() + self.settings.resync
        next_slice_check = time.monotonic() + self.settings.slice_check
        while not self._stopping.is_set():
            now = time.monotonic()
            if now >= next_resync:
                self._written = None  # read back and compare: catches edits by others
                self._forget_slice()
                self._dirty = True
                next_resync = now + self.settings.resync
            if self.slices is not None and now >= next_slice_check:
                self._forget_slice()  # a deleted slice is made again at once
                self._dirty = True
                next_slice_check = now + self.settings.slice_check
            try:
                if self._dirty:
                    self._dirty = False
                    self._sync()
                if now >= next_renew:
                    self._renew()
                    next_renew = now + self.settings.renew
                self._failures = 0
            except (KubeError, ApiError) as e:
                self._dirty = True
                self._written = None
                self._forget_slice()
                self._lease = None
                self._failures += 1
                # Capped well inside the Lease, so a short API outage does not age the heartbeat.
                cap = min(self.settings.backoff_max, self.settings.lease_seconds / 4)
                delay = min(cap, 0.5 * 2 ** min(self._failures, 8))
                delay *= random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not a secret
                log.warning("sync failed (%s); retrying in %.1fs", e, delay)
                self._stopping.wait(delay)
                continue
            due = min(next_renew, next_resync)
            if self.slices is not None:
                due = min(due, next_slice_check)
            wait = max(0.0, due - time.monotonic())
            self._wake.wait(wait)
            if self._wake.is_set():
                self._wake.clear()
                self._stopping.wait(self.settings.settle)  # let a burst finish
        log.info("syncer stopped; writes: %s", dict(self.writes))

    # --- hcsd side -------------------------------------------------------------------

    def _watch_hcsd(self) -> None:
        """Mark the state dirty on every hcsd event; reconnect with backoff when it goes."""
        failures = 0
        while not self._stopping.is_set():
            client = Client(self.settings.socket_path, timeout=5.0)
            try:
                for _ in client.watch(send_initial=False):
                    failures = 0
                    self._dirty = True
                    self._wake.set()
                    if self._stopping.is_set():
                        return
            except ApiError as e:
                failures += 1
                if failures == 1:
                    log.warning("watching hcsd: %s", e)
            finally:
                client.close()
            self._dirty = True
            self._wake.set()
            self._stopping.wait(min(10.0, 0.2 * 2 ** min(failures, 6)))

    def _fetch_keys(self) -> None:
        """Fetch and install this node's keys when due; a change of the ids hcsd holds is
        written to the ComputeNode's status (assignmentKeys)."""
        assert self.keys is not None
        while not self._stopping.is_set():
            before = self.keys.installed
            self.keys.run_once()  # logs and schedules its retry on failure
            if self.keys.installed != before:
                self._dirty = True
                self._wake.set()
            self._stopping.wait(max(0.0, self.keys.next_at - time.monotonic()))

    def _read_hcsd(self) -> tuple[dict[str, Any], dict[str, Any]]:
        with Client(self.settings.socket_path, timeout=5.0) as hcsd:
            node = hcsd.node()
            devices = hcsd.devices()
            allocations = hcsd.allocations()
        self._devices = list(devices)
        previous = (self._written or {}).get("status") or {}
        spec = node_spec(node, devices)
        spec["nodeName"] = self.settings.node_name  # the Kubernetes name wins over hcsd's
        status = node_status(
            devices,
            allocations,
            previous=previous,
            now=rfc3339(self.clock()),
            # hcsd without runtime integration (no mode) verifies no assignment
            key_ids=node.assignment_key_ids if node.mode else None,
        )
        # status.fleet is hcs-controller's (slow devices against the fleet): carried over as
        # the object holds it, so this write neither drops it nor differs because of it.
        if previous.get("fleet"):
            status["fleet"] = previous["fleet"]
        return spec, status

    # --- API side ----------------------------------------------------------------------

    def _sync(self) -> None:
        try:
            spec, status = self._read_hcsd()
        except ApiError as e:
            self._hcsd_up = False
            log.warning("cannot read hcsd: %s (the heartbeat stops until it answers)", e)
            return
        self._hcsd_up = True
        if self._written is None:
            try:
                self._written = self.kube.get(self.node_path)
            except KubeError as e:
                if not e.not_found:
                    raise
                self._written = self.kube.create(
                    self.node_path.rsplit("/", 1)[0], compute_node(self.settings.node_name, spec)
                )
                self.writes["create"] += 1
                log.info("created ComputeNode %s", self.settings.node_name)
            # Transition times of what is there now, so a resync does not rewrite them.
            _, status = self._read_hcsd()
        if self._differs("spec", spec):
            self._written = self.kube.patch(self.node_path, {"spec": spec})
            self._kept("spec", spec)
            self.writes["spec"] += 1
            log.info(
                "inventory of %s written (%d devices)",
                self.settings.node_name,
                len(spec["devices"]),
            )
        # status.fleet as the object holds it now: the spec PATCH above answered with the
        # newest object, which may carry a fleet written since `status` was built; the PUT
        # below would drop it.
        fleet = ((self._written or {}).get("status") or {}).get("fleet")
        if fleet:
            status["fleet"] = fleet
        else:
            status.pop("fleet", None)
        if self._differs("status", status):
            self._written = self.kube.request(
                "PUT",
                self.node_path + "/status",
                body={**self._written, "status": status},
            )
            self._kept("status", status)
            self.writes["status"] += 1
        self._mark_mode()
        if self.slices is not None:
            self.slices.publish(self._devices)
        self.synced.set()

    def _forget_slice(self) -> None:
        if self.slices is not None:
            self.slices.forget()

    def _mark_mode(self) -> None:
        """The ComputeNode's `hcs.io/mode` label: `dra` while this node's devices go through
        its ResourceSlice (the extender skips the node); absent means extender mode, so an
        extender-mode syncer writes it only to take a node back from DRA mode."""
        assert self._written is not None
        labels = (self._written.get("metadata") or {}).get("labels") or {}
        if labels.get(MODE_LABEL, MODE_EXTENDER) == self.settings.mode:
            return
        self._written = self.kube.patch(
            self.node_path, {"metadata": {"labels": {MODE_LABEL: self.settings.mode}}}
        )
        self.writes["mode"] += 1
        log.info("ComputeNode %s is in %s mode", self.settings.node_name, self.settings.mode)

    def _differs(self, part: str, body: Any) -> bool:
        """Whether `part` must be written: the object holds neither `body` nor what the
        server kept of the same body last time (someone else's edit is still repaired)."""
        assert self._written is not None
        stored = self._written.get(part)
        if stored == body:
            return False
        sent, kept = self._sent.get(part, (None, None))
        return not (body == sent and stored == kept)

    def _kept(self, part: str, body: Any) -> None:
        """Remember what was sent and what the server kept; name what it pruned, once."""
        assert self._written is not None
        kept = self._written.get(part)
        self._sent[part] = (body, kept)
        pruned = sorted(set(_paths(body, part)) - set(_paths(kept, part)) - self._pruned_logged)
        if pruned:
            self._pruned_logged.update(pruned)
            log.warning(
                "the API server pruned %s from ComputeNode %s: its CRD is older than this "
                "syncer (apply the CRDs before upgrading the syncers)",
                ", ".join(pruned),
                self.settings.node_name,
            )

    def _renew(self) -> None:
        """The heartbeat: only while hcsd answers, so the extender sees a dead node go."""
        if not self._hcsd_up:
            try:
                with Client(self.settings.socket_path, timeout=3.0) as hcsd:
                    hcsd.node()
                self._hcsd_up = True
                self._dirty = True
            except ApiError:
                return
        now = micro_time(self.clock())
        if self._lease is None:
            try:
                self._lease = self.kube.get(self.lease_path)
            except KubeError as e:
                if not e.not_found:
                    raise
                body = lease_object(
                    NODE_LEASE_PREFIX + self.settings.node_name,
                    self.settings.namespace,
                    {
                        "holderIdentity": self.settings.node_name,
                        "leaseDurationSeconds": self.settings.lease_seconds,
                        "acquireTime": now,
                        "renewTime": now,
                    },
                )
                self._lease = self.kube.create(self.lease_path.rsplit("/", 1)[0], body)
                self.writes["lease"] += 1
                return
        lease = dict(self._lease)
        lease["spec"] = {
            **lease.get("spec", {}),
            "holderIdentity": self.settings.node_name,
            "leaseDurationSeconds": self.settings.lease_seconds,
            "renewTime": now,
        }
        try:
            self._lease = self.kube.replace(self.lease_path, lease)
        except KubeError as e:
            self._lease = None  # someone else wrote it: read it again next time
            if not e.conflict:
                raise
            return
        self.writes["lease"] += 1


def _paths(value: Any, prefix: str) -> set[str]:
    """Every field path in `value` (`status.devices[].reason`): to name the pruned ones."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            found.add(f"{prefix}.{key}")
            found |= _paths(inner, f"{prefix}.{key}")
    elif isinstance(value, list):
        for item in value:
            found |= _paths(item, f"{prefix}[]")
    return found
