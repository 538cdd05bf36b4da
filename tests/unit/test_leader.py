"""Leader election over the Lease protocol, against a small object server (objectserver.py):
the Lease's fields, expiry on the replica's clock, lost races (409 on create or replace),
API errors, and renewals that fail past the deadline. tests/cluster/test_leader.py runs the
same elector against a real kube-apiserver with the shipped RBAC."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hcsd.cluster.kube import KubeError
from hcsd.cluster.leader import LeaderElector
from hcsd.cluster.timefmt import micro_time
from tests.harness.waiting import wait_for
from tests.unit.objectserver import ObjectServer

LEASE = "/apis/coordination.k8s.io/v1/namespaces/hcs-system/leases/extender"
T0 = 1_760_000_000.0


@pytest.fixture
def server() -> Iterator[ObjectServer]:
    running = ObjectServer()
    yield running
    running.close()


def elector(server: ObjectServer, identity: str, now: float = T0, **kw: Any) -> LeaderElector:
    return LeaderElector(server.kube(), "hcs-system", "extender", identity, clock=lambda: now, **kw)


def spec(server: ObjectServer) -> dict[str, Any]:
    lease = server.get(LEASE)
    assert lease is not None
    found: dict[str, Any] = lease["spec"]
    return found


def test_the_first_replica_creates_the_lease(server: ObjectServer) -> None:
    a = elector(server, "a", duration=15)
    assert a.try_acquire() and a.is_leader()
    assert spec(server) == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "acquireTime": micro_time(T0),
        "renewTime": micro_time(T0),
        "leaseTransitions": 0,
    }


def test_renewing_keeps_the_acquire_time_and_the_transitions(server: ObjectServer) -> None:
    assert elector(server, "a").try_acquire()
    assert elector(server, "a", T0 + 5).try_acquire()
    renewed = spec(server)
    assert (renewed["acquireTime"], renewed["renewTime"]) == (micro_time(T0), micro_time(T0 + 5))
    assert renewed["leaseTransitions"] == 0


@pytest.mark.parametrize(
    ("later", "taken"),
    [
        pytest.param(14.0, False, id="fresh"),
        pytest.param(15.5, True, id="expired"),
    ],
)
def test_a_standby_takes_the_lease_only_once_it_expired(
    server: ObjectServer, later: float, taken: bool
) -> None:
    assert elector(server, "a", duration=15).try_acquire()
    b = elector(server, "b", T0 + later, duration=15)
    assert b.try_acquire() is taken and b.is_leader() is taken
    after = spec(server)
    if taken:
        assert (after["holderIdentity"], after["leaseTransitions"]) == ("b", 1)
        assert after["acquireTime"] == after["renewTime"] == micro_time(T0 + later)
    else:
        assert (after["holderIdentity"], after["renewTime"]) == ("a", micro_time(T0))
        assert server.count("PUT") == 0  # a standby writes nothing while the Lease is held


def test_a_lease_without_a_holder_is_free(server: ObjectServer) -> None:
    server.store(LEASE, {"metadata": {"name": "extender"}, "spec": {"renewTime": micro_time(T0)}})
    assert elector(server, "b").try_acquire()
    assert spec(server)["holderIdentity"] == "b"


@pytest.mark.parametrize("method", ["POST", "PUT"])
def test_a_lost_race_is_not_leading(server: ObjectServer, method: str) -> None:
    """Another replica wrote first: the create or the replace gets 409."""
    a = elector(server, "a")
    if method == "PUT":
        assert a.try_acquire()
    server.refuse(method, 409)
    assert not a.try_acquire()
    assert not a.is_leader()


def test_api_errors_reach_the_caller_and_the_loop_retries(
    server: ObjectServer, caplog: pytest.LogCaptureFixture
) -> None:
    a = elector(server, "a", renew=0.05)
    server.refuse("GET", 500)
    with pytest.raises(KubeError, match="500"):
        a.try_acquire()
    server.refuse("GET", 503)
    with caplog.at_level(logging.INFO, "hcsd.cluster.leader"):
        a.start()
        wait_for(a.is_leader, "the retry took the Lease", timeout=5)
        a.stop(wait=5)  # its "acquired" line follows is_leader(): logged before the level goes
    assert "leader election: 503 ServiceUnavailable" in caplog.text
    assert "a acquired leadership" in caplog.text


def test_a_leader_that_cannot_renew_stops_leading_by_the_deadline(server: ObjectServer) -> None:
    a = elector(server, "a", duration=0.3)
    assert a.try_acquire()
    server.refuse("PUT", 500)
    with pytest.raises(KubeError):
        a.try_acquire()
    assert a.is_leader()  # the Lease it holds is still valid for the others too
    time.sleep(0.35)
    assert not a.is_leader()
