"""The requeue guard: touches only while the API server refuses what admission-requeue.yaml
forbids (tests/cluster/test_requeue.py asks a real API server with and without the policy)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from hcsd.cluster.kube import Kube, KubeError
from hcsd.cluster.requeue_guard import POLICY, RequeueGuard
from tests.unit.fleet import add_node, beat
from tests.unit.test_requeue import FULL, refuse, setup, touched

DENIED = (
    f"pods \"x\" is forbidden: ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' "
    "denied request: hcs-scheduler-extender may touch only pods that are not bound yet"
)


class Probes(Kube):
    """The API server's answer to the guard's dry-run patch: `answer` is a status, 200 for
    accepted."""

    def __init__(self) -> None:  # no connection: nothing else is called
        self.answer: tuple[int, str] = (403, DENIED)
        self.asked: list[tuple[str, list[tuple[str, str]], Any]] = []

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self.asked.append((path, list(kwargs.get("query", ())), kwargs.get("body")))
        status, message = self.answer
        if status != 200:
            raise KubeError(status, "Forbidden", message)
        return {}


REGISTRY = CollectorRegistry


def guarded(**kwargs: Any) -> tuple[Any, Any, Any, Any, Probes, RequeueGuard]:
    e, requeue, kube, clock = setup()
    add_node(e, "n", allocated=FULL)
    beat(e, "n")
    refuse(e, "p", 40, ["n"])
    requeue.step()
    probes = Probes()
    requeue.guard = RequeueGuard(probes, REGISTRY(), clock=clock, **kwargs)
    return e, requeue, kube, clock, probes, requeue.guard


def test_touches_only_while_the_policy_refuses_a_dry_run_label_change() -> None:
    e, requeue, kube, _, probes, guard = guarded()
    add_node(e, "n", version=2)
    assert requeue.step() == 1 and touched(kube) == ["p"]
    ((path, query, body),) = probes.asked  # the refused pod itself: no own pod named
    assert path.endswith("/pods/p") and ("dryRun", "All") in query
    assert body == {"metadata": {"labels": {"hcs.io/requeue-guard": "probe"}}}
    assert guard.state == "enforced"


@pytest.mark.parametrize(
    ("answer", "state"),
    [
        ((200, ""), "open"),  # the policy is missing: the label change would go through
        ((403, 'pods "x" is forbidden: User cannot patch resource "pods"'), "forbidden"),
        ((0, "connection refused"), "error"),
    ],
)
def test_no_touch_unless_the_policy_is_seen_refusing(
    answer: tuple[int, str], state: str, caplog: Any
) -> None:
    e, requeue, kube, _, probes, guard = guarded()
    probes.answer = answer
    add_node(e, "n", version=2)
    with caplog.at_level("WARNING"):
        assert requeue.step() == 0
    assert kube.sent == [] and guard.state == state
    if state == "open":
        assert any(r.levelname == "ERROR" and POLICY in r.getMessage() for r in caplog.records)


def test_the_policy_is_asked_again_every_period_and_on_the_own_pod() -> None:
    e, requeue, kube, clock, probes, guard = guarded(own=("hcs-system", "extender-0"), every=600)
    add_node(e, "n", version=2)
    assert requeue.step() == 1
    assert [p for p, _, _ in probes.asked] == ["/api/v1/namespaces/hcs-system/pods/extender-0"]
    probes.answer = (200, "")  # the policy was deleted
    clock.now += 599
    assert guard.allows() and len(probes.asked) == 1  # not yet due
    clock.now += 1
    add_node(e, "n", allocated=FULL, version=3)
    refuse(e, "p", 40, ["n"])
    add_node(e, "n", version=4)
    assert requeue.step() == 0 and touched(kube) == ["p"]  # the first touch only
    assert guard.state == "open" and len(probes.asked) == 2


def test_the_gauge_shows_the_state() -> None:
    registry = CollectorRegistry()
    probes = Probes()
    guard = RequeueGuard(probes, registry, own=("hcs-system", "extender-0"))
    value = lambda s: registry.get_sample_value("hcs_extender_requeue_guard", {"state": s})  # noqa: E731
    assert value("unchecked") == 1 and value("enforced") == 0
    assert guard.allows()
    assert value("unchecked") == 0 and value("enforced") == 1
