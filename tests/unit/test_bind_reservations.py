"""What a bind does to the reservations (the assume cache) when it is refused, fails, fails
halfway or cannot tell whether it succeeded: it never removes a reservation it did not make,
and never leaves one behind that nothing will settle."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hcsd.cluster.binding import UNSETTLED_SECONDS, BindRequest
from hcsd.cluster.extender import Extender
from hcsd.cluster.kube import KubeError
from tests.unit.fleet import GiB, add_node, assigned, beat
from tests.unit.test_bind_pod_source import unbound
from tests.unit.test_extender_state import new_extender


def pending(name: str, uid: str, gib: int = 60) -> dict[str, Any]:
    pod = unbound({"ai.compute/vram": f"{gib}Gi"}, uid=uid)
    pod["metadata"]["name"] = name
    pod["metadata"]["annotations"] = {}
    pod["spec"]["schedulerName"] = "default-scheduler"
    pod["spec"]["containers"] = pod["spec"]["containers"][:1]
    return pod


class FakeApiServer:
    """The pods and the Binding subresource as the API server keeps them: a Binding's uid and
    resourceVersion are preconditions (409 when they do not match), a bound pod cannot be
    bound again, and the write bumps the pod's resourceVersion."""

    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.gets = 0
        self.bindings: list[dict[str, Any]] = []
        self.fail: KubeError | None = None  # the next Binding's answer instead
        self.version = 100

    def get(self, path: str) -> dict[str, Any]:
        self.gets += 1
        return copy.deepcopy(self.pods[path.rsplit("/", 1)[1]])

    def touch(self, name: str, annotations: dict[str, str]) -> dict[str, Any]:
        """A write to the pod (the requeue's touch, a user's annotation): a new version."""
        pod = self.pods[name]
        pod["metadata"]["annotations"] = {**pod["metadata"]["annotations"], **annotations}
        self.version += 1
        pod["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(pod)

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.bindings.append(body)
        if self.fail is not None:
            failure, self.fail = self.fail, None
            raise failure
        pod = self.pods[path.rsplit("/", 2)[1]]
        meta = body["metadata"]
        for field in ("uid", "resourceVersion"):
            if field in meta and meta[field] != pod["metadata"][field]:
                raise KubeError(409, "Conflict", f"Precondition failed: {field}")
        if pod["spec"].get("nodeName"):
            raise KubeError(500, "InternalError", "pod is already assigned")
        pod["spec"]["nodeName"] = body["target"]["name"]
        pod["metadata"]["annotations"] |= meta.get("annotations", {})
        self.touch(pod["metadata"]["name"], {})
        return body


def cluster(*pods: dict[str, Any], devices: int = 2) -> tuple[Extender, FakeApiServer]:
    """An extender with one node of `devices` 80 GiB A100s, its watch showing `pods`."""
    e = new_extender()
    add_node(e, "n", count=devices)
    beat(e, "n")
    server = FakeApiServer(*pods)
    e.binder.kube = server  # type: ignore[assignment]
    for pod in pods:
        watch(e, pod)
    return e, server


def watch(e: Extender, pod: dict[str, Any]) -> None:
    meta = pod["metadata"]
    e.state.pods.apply(f"ns/{meta['name']}", e.state.pods.transform(copy.deepcopy(pod)))


def used(e: Extender) -> list[float]:
    nodes = e.state.snapshot().nodes["n"]
    return [getattr(nodes.usage.get(f"n-{i}"), "vram_bytes", 0) / GiB for i in range(2)]


def bind(e: Extender, name: str, uid: str) -> str:
    return e.bind(BindRequest("ns", name, uid, "n"))


def test_a_second_bind_of_a_bound_pod_is_refused_and_keeps_its_reservation() -> None:
    """kube-scheduler binds again a pod it already bound (its first call timed out): the
    second bind must neither succeed nor take away what the pod holds."""
    e, server = cluster(pending("p", "u1"), pending("q", "u2"), pending("r", "u3"))
    assert bind(e, "p", "u1") == ""
    watch(e, server.pods["p"])  # the watch shows it bound, with its assignment
    assert used(e) == [60, 0]
    refused = bind(e, "p", "u1")
    assert "already bound to n" in refused
    assert used(e) == [60, 0]
    assert bind(e, "q", "u2") == "" and bind(e, "r", "u3") != ""  # no third 60 GiB slice
    assert sorted(used(e)) == [60, 60]


def test_a_second_bind_before_the_watch_shows_the_first_keeps_its_reservation() -> None:
    e, _ = cluster(pending("p", "u1"), pending("q", "u2"), pending("r", "u3"))
    assert bind(e, "p", "u1") == ""  # assumed, Binding written, not shown by the watch yet
    assert bind(e, "p", "u1") != ""  # the API server refuses it: the pod is bound
    assert used(e) == [60, 0]
    assert bind(e, "q", "u2") == "" and bind(e, "r", "u3") != ""
    assert sorted(used(e)) == [60, 60]


def test_assume_never_replaces_what_the_informer_shows_the_pod_holding() -> None:
    e, _ = cluster()
    e.state.pods.apply("ns/p", assigned("u1", "n", (0, 60)))
    assert e.state.assume("u1", "n", assigned("u1", "n", (1, 8)).holds) is None
    assert used(e) == [60, 0]


def test_forget_drops_only_the_reservation_its_bind_made() -> None:
    e, _ = cluster()
    first = e.state.assume("u1", "n", assigned("u1", "n", (0, 60)).holds)
    assert first is not None
    assert e.state.assume("u1", "n", assigned("u1", "n", (1, 8)).holds) is None  # in flight
    e.state.forget("u1", first + 1)  # another bind's token: not this reservation
    assert used(e) == [60, 0]
    e.state.pods.apply("ns/p", assigned("u1", "n", (1, 8)))  # the informer's word replaces it
    e.state.forget("u1", first)  # the assumption is gone: nothing of the informer's goes
    assert used(e) == [0, 8]


@pytest.mark.parametrize("status", [403, 404, 500], ids=["forbidden", "gone", "internal"])
def test_a_refused_binding_forgets_only_its_own_reservation(status: int) -> None:
    e, server = cluster(pending("p", "u1"))
    server.fail = KubeError(status, "Refused", "no")
    assert bind(e, "p", "u1") != ""
    assert used(e) == [0, 0]


def test_a_bind_that_breaks_between_assume_and_write_forgets_its_reservation() -> None:
    e, server = cluster(pending("p", "u1"))

    def broken() -> Any:
        raise RuntimeError("keyring not loaded")

    e.binder.keys = broken
    with pytest.raises(RuntimeError):
        bind(e, "p", "u1")
    assert used(e) == [0, 0] and server.bindings == []


def test_a_pod_deleted_before_the_watch_shows_it_bound_holds_nothing() -> None:
    e, _ = cluster(pending("p", "u1"))
    assert e.state.assume("u1", "n", assigned("u1", "n", (0, 60)).holds) is not None
    e.state.pods.apply("ns/p", None)  # DELETED, unbound as the watch last showed it
    assert used(e) == [0, 0]


def test_a_pod_replaced_under_its_name_drops_the_old_ones_reservation() -> None:
    e, _ = cluster(pending("p", "u1"))
    assert e.state.assume("u1", "n", assigned("u1", "n", (0, 60)).holds) is not None
    watch(e, pending("p", "u2"))  # deleted and created again: the events seen as one update
    assert used(e) == [0, 0]


def reads(e: Extender) -> dict[str, float | None]:
    return {s: e.metrics.value("hcs_extender_bind_pod_reads_total", source=s)
            for s in ("watch", "get", "conflict")}  # fmt: skip


def test_the_binding_names_the_version_of_the_pod_it_was_decided_on() -> None:
    e, server = cluster(pending("p", "u1"))
    assert bind(e, "p", "u1") == ""
    meta = server.bindings[0]["metadata"]
    assert (meta["uid"], meta["resourceVersion"]) == ("u1", "7")
    assert reads(e) == {"watch": 1, "get": 0, "conflict": 0}


def test_a_copy_out_of_date_is_never_signed_for() -> None:
    """The hints changed after the watch's copy (A100 then, H100 only now): the API server
    refuses the Binding made from the copy, and bind decides again on the pod as it is."""
    e, server = cluster(pending("p", "u1"))  # the node has A100s
    watch(e, server.touch("p", {"hcs.io/models": "A100"}))
    server.touch("p", {"hcs.io/models": "H100"})  # not shown by the watch yet
    refused = bind(e, "p", "u1")
    assert "can no longer take the pod" in refused and "models h100" in refused
    assert [b["metadata"]["resourceVersion"] for b in server.bindings] == ["101"]
    assert server.gets == 1 and reads(e) == {"watch": 1, "get": 0, "conflict": 1}
    assert used(e) == [0, 0] and not server.pods["p"]["spec"].get("nodeName")


def test_a_pod_touched_after_the_copy_is_bound_on_the_second_try() -> None:
    """The requeue's touch (or any write) moves the pod's version past the watch's copy:
    the first Binding is refused (409), bind reads the pod and binds it in the same call."""
    e, server = cluster(pending("p", "u1"))
    server.touch("p", {"hcs.io/capacity-freed": "n 2026-01-01T00:00:00Z"})
    assert bind(e, "p", "u1") == ""
    assert [b["metadata"]["resourceVersion"] for b in server.bindings] == ["7", "101"]
    assert server.pods["p"]["spec"]["nodeName"] == "n" and used(e) == [60, 0]
    assert reads(e) == {"watch": 1, "get": 0, "conflict": 1}
    watch(e, server.pods["p"])  # and the watch's word on it replaces the reservation
    assert used(e) == [60, 0]


def test_a_pod_read_with_a_get_is_not_tried_again() -> None:
    e, server = cluster()
    server.pods["p"] = pending("p", "u1")  # not shown by the watch
    server.fail = KubeError(409, "Conflict", "Precondition failed: resourceVersion")
    assert "409" in bind(e, "p", "u1")
    assert len(server.bindings) == 1 and used(e) == [0, 0]


def test_a_second_refusal_is_the_answer() -> None:
    """At most one retry per call: a pod written faster than bind can read it waits for
    kube-scheduler's next try."""
    e, server = cluster(pending("p", "u1"))
    server.touch("p", {"a": "1"})
    original = server.get

    def get_then_touch(path: str) -> dict[str, Any]:
        found = original(path)
        server.touch("p", {"a": "2"})
        return found

    server.get = get_then_touch  # type: ignore[method-assign]
    assert "409" in bind(e, "p", "u1")
    assert len(server.bindings) == 2 and used(e) == [0, 0]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    "failure",
    [KubeError(0, "Unreachable", "POST binding: read timed out"),
     KubeError(504, "Timeout", "the server was unable to return a response in time")],
    ids=["no-answer", "gateway-timeout"],
)  # fmt: skip
def test_a_binding_of_unknown_outcome_keeps_its_reservation_until_settled(
    failure: KubeError,
) -> None:
    """The write may have been done: the pod may hold the grants. The reservation stays
    until the watch shows the pod bound, or, if it never does, for a bounded time."""
    e, server = cluster(pending("p", "u1"), pending("q", "u2"), pending("r", "u3"))
    clock = e.state.monotonic = Clock()
    server.fail = failure
    assert "outcome is unknown" in bind(e, "p", "u1")
    assert used(e) == [60, 0]
    assert "not settled" in bind(e, "p", "u1")  # kube-scheduler's retry waits for it
    assert bind(e, "q", "u2") == "" and bind(e, "r", "u3") != ""  # no slice booked twice
    clock.now += UNSETTLED_SECONDS + 1  # the pod never showed bound: the write was lost
    assert sorted(used(e)) == [0, 60]
    assert bind(e, "r", "u3") == ""


def test_a_binding_of_unknown_outcome_is_settled_by_the_watch() -> None:
    e, server = cluster(pending("p", "u1"))
    clock = e.state.monotonic = Clock()
    server.fail = KubeError(0, "Unreachable", "read timed out")
    bind(e, "p", "u1")
    e.state.pods.apply("ns/p", assigned("u1", "n", (1, 60)))  # bound after all
    clock.now += UNSETTLED_SECONDS + 1
    assert used(e) == [0, 60]
