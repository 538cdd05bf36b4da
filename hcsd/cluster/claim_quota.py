"""ComputeQuota at admission in DRA mode: refuse a pod whose claim would take its namespace
over a `spec.hard` (docs/dra.md, "ComputeQuota in DRA mode").

kube-scheduler allocates claims without asking HCS, so the webhook is the last point where a
pod can be stopped. The rule, per ComputeQuota of the pod's namespace and per key it sets:

    used + charge > hard  ->  refused (the extender's wording: compute_quota.Quota.excess)

- `used`: (a) every allocated claim of the namespace, counted as the extender counts them
  (claim_usage: consumed memory, reserved share x the device's FP16 TFLOPS, devices); (b)
  every pod of the namespace (not Succeeded or Failed) whose `hcs-accelerator` claim entry
  names a template and whose claim is not allocated yet, charged from what its claim (or,
  before the claim exists, its template) asks for; (c) the pods this process admitted that
  no list shows yet (the API server stores a pod after the webhook answers), for `window`
  seconds at most.
- `charge`: the most the claim can hold, resource by resource, over the alternatives it asks
  for (a VRAM request's memory, or a whole device's: the largest memory of the models it
  allows, as the database knows them or as ComputeNodes publish devices of them; the
  compute share times the largest FP16 figure of those; the device count), summed over its
  requests. A quota is a ceiling: kube-scheduler may take any of
  the alternatives. An alternative naming no model HCS knows cannot be bounded: with a
  ComputeQuota in the namespace such a pod is refused.

Nothing a tenant writes on a pod is trusted: the charge comes from the claim spec (the
template's name is the hash of its spec, claim_shapes.template_name, so a tenant cannot
put other requests under a name the webhook uses), and a pending pod is matched to its
claim through the pod's own `status.resourceClaimStatuses`, written by kube-controller-manager.
The `hcs.io/quota-charge` annotation the webhook writes is for people and for matching this
process's records; its figures are never read back.

One lock per namespace serializes the read-decide-record steps of this process; replicas do
not share their records (the race across them is docs/dra.md's to bound). A namespace gets
one admission in progress and `waiting` more queued behind it, each waiting `turn_wait`
seconds at most: beyond that its pods are refused as busy (429, a retry may pass), so a
namespace that makes its own admissions slow (thousands of big pods to list) slows only
itself. Pods are read a page at a time (`page`), keeping only what the rule needs.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from hcsd.cluster.claim_shapes import Selected, selected
from hcsd.cluster.claim_usage import RESOURCE_VERSION, amounts_of_claim, claim_hold
from hcsd.cluster.compute_quota import Amounts, Quota, QuotaError, quota_of
from hcsd.cluster.kube import KubeError, paths_for
from hcsd.cluster.objects import NodeView, ObjectError, node_view
from hcsd.cluster.webhook_dra import Refused
from hcsd.contract.dra import ANNOTATION_QUOTA_CHARGE, POD_CLAIM_NAME
from hcsd.contract.names import API_VERSION, COMPUTE_NODES, COMPUTE_QUOTAS
from hcsd.model import Device
from hcsd.profiles.database import Profile, ProfileDatabase
from hcsd.profiles.exchange import share_tflops

__all__ = ["QuotaGate", "Unbounded", "charge_of", "read_charge", "write_charge"]

log = logging.getLogger("hcs.webhook")

DONE_PHASES = frozenset({"Succeeded", "Failed"})


class _Api(Protocol):
    def get(self, path: str) -> dict[str, Any]: ...

    def list_all(self, path: str) -> tuple[list[dict[str, Any]], str]: ...

    def pages(
        self, path: str, query: Sequence[tuple[str, str]] = (), *, page: int = 500
    ) -> Iterator[tuple[list[dict[str, Any]], str]]: ...


@dataclass
class _Turns:
    """A namespace's lock and how many admissions hold it or wait for it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    queued: int = 0


class Unbounded(ValueError):
    """A claim request whose charge cannot be bounded (no model HCS knows can serve it, or a
    request this module did not write)."""


def _candidates(request: Selected, db: ProfileDatabase) -> list[Profile]:
    """The known models a request can be served by (unknown names: none)."""
    vendors, models = set(request.vendors), set(request.models)
    return [
        p
        for p in db.profiles
        if (not vendors or p.vendor.value in vendors) and (not models or p.model.lower() in models)
    ]


def _published(request: Selected, devices: Sequence[Device]) -> list[Device]:
    """The devices the cluster's ComputeNodes publish that a request can be served by."""
    vendors, models = set(request.vendors), set(request.models)
    return [
        d
        for d in devices
        if (not vendors or d.vendor.value in vendors) and (not models or d.model.lower() in models)
    ]


def _most(request: Selected, db: ProfileDatabase, devices: Sequence[Device]) -> Amounts:
    """The most one alternative can hold once allocated, as claim_usage would count it: by
    the figures of the models the database knows and of the devices nodes publish (a model
    an admin added, a device bigger than its model's entry), whichever is larger."""
    profiles = _candidates(request, db)
    published = _published(request, devices)
    if not profiles and not published:
        raise Unbounded(
            f"it asks for models HCS does not know ({', '.join(request.models) or 'any'} of "
            f"{', '.join(request.vendors) or 'any vendor'}), so its charge cannot be bounded"
        )
    memory = request.memory
    if memory is None:  # whole devices: the device's whole memory
        memory = max([p.vram_bytes for p in profiles] + [d.vram_bytes for d in published])
    fp16 = max([p.figure("tflops_fp16") for p in profiles] + [d.tflops_fp16 for d in published])
    count = request.count
    return Amounts(memory * count, share_tflops(fp16, request.compute) * count, count)


def charge_of(
    claim: Mapping[str, Any], db: ProfileDatabase, devices: Sequence[Device] = ()
) -> Amounts:
    """What a claim spec is charged while it is not allocated: per device request, the most
    of each resource over its alternatives, summed. Unbounded when one cannot be bounded.
    `devices`: those the cluster's ComputeNodes publish."""
    total = Amounts()
    for request in (claim.get("devices") or {}).get("requests") or ():
        options = request.get("firstAvailable") or [request.get("exactly") or {}]
        try:
            most = [_most(selected(option), db, devices) for option in options]
        except (ValueError, TypeError, AttributeError) as e:
            raise Unbounded(str(e)) from e
        total = total + Amounts(
            max(a.vram for a in most), max(a.tflops for a in most), max(a.devices for a in most)
        )
    return total


def write_charge(amounts: Amounts, token: str) -> str:
    """The annotation's text: the charge, for people, and the token matching this process's
    record to the pod once it is listed."""
    return json.dumps(
        {"vram": amounts.vram, "tflops": round(amounts.tflops, 6), "devices": amounts.devices,
         "token": token},
        separators=(",", ":"),
    )  # fmt: skip


def read_charge(text: object) -> tuple[Amounts, str] | None:
    """The charge and token written by `write_charge`; None for anything else. Any pod can
    carry the annotation, so a figure that is not finite and >= 0 (NaN, negative, 1e999) is
    no charge: it must neither lower `used` nor raise out of the admission."""
    try:
        raw = json.loads(str(text))
        figures = [float(raw["vram"]), float(raw["tflops"]), float(raw["devices"])]
        if not all(math.isfinite(f) and f >= 0 for f in figures):
            return None
        amounts = Amounts(int(figures[0]), figures[1], int(figures[2]))
        return amounts, str(raw.get("token", ""))
    except (ValueError, TypeError, KeyError, OverflowError, AttributeError):
        return None


class QuotaGate:
    """`admit(namespace, demand, dry_run)` for webhook_dra.dra_patch, against one API client."""

    def __init__(
        self,
        api: _Api,
        db: ProfileDatabase,
        *,
        window: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        waiting: int = 8,
        turn_wait: float = 3.0,
        deadline: float = 4.0,
        page: int = 25,
        view_ttl: float = 10.0,
    ) -> None:
        self.api = api
        self.db = db
        self.window = window
        self.clock = clock
        self.waiting = waiting
        self.turn_wait = turn_wait
        self.deadline = deadline  # the API server waits timeoutSeconds (5 s in the chart)
        self.page = page
        self.view_ttl = view_ttl
        self._turns: dict[str, _Turns] = {}
        self._guard = threading.Lock()
        self._admitted: dict[str, tuple[str, Amounts, float]] = {}  # token: ns, charge, when
        self._views: dict[str, tuple[NodeView | None, float]] = {}  # node: view, when read
        self._devices: tuple[tuple[Device, ...], float] | None = None  # published, when read

    @contextmanager
    def _turn(self, namespace: str, wait: float) -> Iterator[None]:
        """Hold the namespace's lock; Refused (429) when `waiting` admissions of it already
        queue, or when the lock does not come within `wait` seconds. The entry goes
        when nobody holds or waits for it, so names never seen again leave nothing."""
        with self._guard:
            turns = self._turns.setdefault(namespace, _Turns())
            if turns.queued > self.waiting:
                raise Refused(self._busy(namespace), 429)
            turns.queued += 1
        try:
            if not turns.lock.acquire(timeout=max(wait, 0.0)):
                raise Refused(self._busy(namespace), 429)
            try:
                yield
            finally:
                turns.lock.release()
        finally:
            with self._guard:
                turns.queued -= 1
                if turns.queued == 0:
                    del self._turns[namespace]

    def _busy(self, namespace: str) -> str:
        return (
            f"ComputeQuota of namespace {namespace}: too many admissions of this namespace "
            f"at once (one at a time, {self.waiting} waiting); a retry may pass"
        )

    def _list(self, path: str, what: str) -> list[dict[str, Any]]:
        try:
            return self.api.list_all(path)[0]
        except KubeError as e:
            message = f"failed to list {what} for the ComputeQuota: {e} (a retry may pass)"
            raise Refused(message, 500) from e

    def _quotas(self, namespace: str) -> list[Quota]:
        found = []
        for obj in self._list(paths_for(API_VERSION, COMPUTE_QUOTAS, namespace), "ComputeQuotas"):
            try:
                found.append(quota_of(obj))
            except QuotaError as e:  # the extender skips it too: its spec says nothing
                log.warning("%s", e)
        return found

    def _view(self, node: str) -> NodeView | None:
        """The node's ComputeNode as the counting rules read it, kept `view_ttl` seconds
        (only its devices' FP16 figures are used, and they change with hardware)."""
        now = self.clock()
        with self._guard:
            kept = self._views.get(node)
        if kept is not None and now - kept[1] < self.view_ttl:
            return kept[0]
        try:
            view = node_view(self.api.get(paths_for(API_VERSION, COMPUTE_NODES, name=node)))
        except KubeError as e:
            if not e.not_found:
                raise Refused(
                    f"failed to read ComputeNode {node}: {e} (a retry may pass)", 500
                ) from e
            view = None
        except ObjectError:
            view = None
        with self._guard:
            self._views = {k: v for k, v in self._views.items() if now - v[1] < self.view_ttl}
            self._views[node] = (view, now)
        return view

    def _published_devices(self) -> tuple[Device, ...]:
        """Every device the ComputeNodes publish, kept `view_ttl` seconds: whole-device
        charges are bounded by them too (a device bigger than its model's entry)."""
        now = self.clock()
        with self._guard:
            kept = self._devices
        if kept is not None and now - kept[1] < self.view_ttl:
            return kept[0]
        found: list[Device] = []
        try:
            nodes = self.api.list_all(paths_for(API_VERSION, COMPUTE_NODES))[0]
        except KubeError as e:
            if not e.not_found:  # 404: no ComputeNode type yet, so no device published
                message = (
                    f"failed to list ComputeNodes for the ComputeQuota: {e} (a retry may pass)"
                )
                raise Refused(message, 500) from e
            nodes = []
        for obj in nodes:
            try:
                found.extend(node_view(obj).devices)
            except ObjectError as e:
                log.warning("%s", e)
        with self._guard:
            self._devices = (tuple(found), now)
        return tuple(found)

    def _claims(self, namespace: str) -> tuple[Amounts, dict[str, dict[str, Any] | None]]:
        """The namespace's allocated claims' amounts, and every claim by name: None for an
        allocated one (it is counted here), the spec of one not allocated yet."""
        holds, by_name = [], {}
        path = paths_for(RESOURCE_VERSION, "resourceclaims", namespace)
        for obj in self._list(path, "ResourceClaims"):
            name = str((obj.get("metadata") or {}).get("name"))
            try:
                hold = claim_hold(obj)
            except ValueError as e:
                log.warning("ResourceClaim %s: %s", name, e)
                continue
            by_name[name] = None if hold is not None else dict(obj.get("spec") or {})
            if hold is not None:
                holds.append(hold)
        views: dict[str, NodeView | None] = {}
        total = Amounts()
        for hold in holds:
            for share in hold.shares:
                if share.node not in views:
                    views[share.node] = self._view(share.node)
            total = total + amounts_of_claim(hold, views.get)
        return total, by_name

    def _templates(self, namespace: str) -> dict[str, dict[str, Any]]:
        path = paths_for(RESOURCE_VERSION, "resourceclaimtemplates", namespace)
        return {
            str((t.get("metadata") or {}).get("name")): dict(
                (t.get("spec") or {}).get("spec") or {}
            )
            for t in self._list(path, "ResourceClaimTemplates")
        }

    def _pending(
        self,
        pods: Iterable[Mapping[str, Any]],
        claims: Mapping[str, dict[str, Any] | None],
        templates: Mapping[str, dict[str, Any]],
        devices: Sequence[Device] = (),
    ) -> Amounts:
        """Charges of the live pods whose `hcs-accelerator` claim is not allocated, from the
        claim's spec or, before the claim is made, the template's, as `admit` charged them
        (`devices`: those published); forgets the records of the pods listed."""
        total = Amounts()
        for pod in pods:
            meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
            status = pod.get("status") or {}
            entry = next((r for r in spec.get("resourceClaims") or ()
                          if r.get("name") == POD_CLAIM_NAME), None)  # fmt: skip
            if entry is None or not entry.get("resourceClaimTemplateName"):
                continue
            charged = read_charge((meta.get("annotations") or {}).get(ANNOTATION_QUOTA_CHARGE))
            if charged is not None:
                with self._guard:
                    self._admitted.pop(charged[1], None)
            if status.get("phase") in DONE_PHASES:
                continue
            made = next((str(s.get("resourceClaimName")) for s in
                         status.get("resourceClaimStatuses") or ()
                         if s.get("name") == POD_CLAIM_NAME and s.get("resourceClaimName")),
                        None)  # fmt: skip
            if made is not None and made in claims:
                source = claims[made]  # None: allocated, counted with the claims
            else:
                source = templates.get(str(entry["resourceClaimTemplateName"]))
            if source is None:
                continue
            try:
                total = total + charge_of(source, self.db, devices)
            except Unbounded as e:  # a template this webhook did not write: counted once allocated
                log.warning("pod %s/%s: its claim is not charged: %s",
                            meta.get("namespace"), meta.get("name"), e)  # fmt: skip
        return total

    def _live_pods(self, namespace: str) -> Iterator[dict[str, Any]]:
        """The namespace's pods not Succeeded or Failed, a page at a time."""
        done = ",".join(f"status.phase!={phase}" for phase in sorted(DONE_PHASES))
        path = paths_for("v1", "pods", namespace)
        try:
            for chunk, _ in self.api.pages(path, [("fieldSelector", done)], page=self.page):
                yield from chunk
        except KubeError as e:
            message = f"failed to list pods for the ComputeQuota: {e} (a retry may pass)"
            raise Refused(message, 500) from e

    def used(self, namespace: str) -> Amounts:
        """(a) + (b) + (c) of the module's rule; call with the namespace's lock held."""
        claims, by_name = self._claims(namespace)
        templates = self._templates(namespace)
        devices = self._published_devices()
        total = claims + self._pending(self._live_pods(namespace), by_name, templates, devices)
        now = self.clock()
        with self._guard:
            for token, (where, amounts, when) in list(self._admitted.items()):
                if now - when > self.window:
                    del self._admitted[token]
                elif where == namespace:
                    total = total + amounts
        return total

    def admit(self, namespace: str, claim: Mapping[str, Any], dry_run: bool) -> str:
        """The charge to write on the pod whose claim spec is `claim` (written with no
        ComputeQuota too); Refused (403) when the pod would go over a quota, or when its
        charge cannot be bounded and the namespace has a quota."""
        token = uuid.uuid4().hex
        started = time.monotonic()
        if not self._quotas(namespace):  # nothing to decide: no turn taken
            return write_charge(self._unchecked(claim), token)
        wait = min(self.turn_wait, self.deadline - (time.monotonic() - started))
        with self._turn(namespace, wait):
            quotas = self._quotas(namespace)  # again, in the turn
            if not quotas:
                return write_charge(self._unchecked(claim), token)
            try:
                charge = charge_of(claim, self.db, self._published_devices())
            except Unbounded as e:
                raise Refused(
                    f"ComputeQuota {namespace}/{quotas[0].name}: this pod's claim "
                    f"cannot be charged: {e}", 403) from e  # fmt: skip
            used = self.used(namespace)
            for quota in quotas:
                why = quota.excess(used, charge)
                if why:
                    raise Refused(why, 403)
            took = time.monotonic() - started
            if took > self.deadline:  # the API server has given up on this answer: no record
                raise Refused(
                    f"ComputeQuota of namespace {namespace}: the decision took {took:.1f}s, "
                    "past what the API server waits; a retry may pass", 429)  # fmt: skip
            if not dry_run:
                when = self.clock()
                with self._guard:
                    self._admitted[token] = (namespace, charge, when)
        return write_charge(charge, token)

    def _unchecked(self, claim: Mapping[str, Any]) -> Amounts:
        """The charge written on a pod of a namespace without a ComputeQuota (for people)."""
        try:
            return charge_of(claim, self.db)
        except Unbounded:
            return Amounts()

    def release(self, annotation: str) -> None:
        """Forget a charge whose pod was refused after all (its template could not be made)."""
        charged = read_charge(annotation)
        if charged is not None:
            with self._guard:
                self._admitted.pop(charged[1], None)
