"""Leader election on a real kube-apiserver Lease, as the extender's replicas run it (with
the extender's own service account, so the shipped RBAC is what allows it)."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from hcsd.cluster.leader import LeaderElector
from tests.cluster.controlplane import ControlPlane

pytestmark = pytest.mark.slow

LEASES = "/apis/coordination.k8s.io/v1/namespaces/hcs-system/leases/"


def elector(plane: ControlPlane, lease: str, identity: str, **kw: Any) -> LeaderElector:
    return LeaderElector(plane.kube("extender"), "hcs-system", lease, identity, **kw)


def spec(plane: ControlPlane, lease: str) -> dict[str, Any]:
    found: dict[str, Any] = plane.kube().get(LEASES + lease)["spec"]
    return found


def test_the_first_replica_takes_the_lease_and_renews_it(plane: ControlPlane) -> None:
    a = elector(plane, "renewed", "a")
    assert a.try_acquire() and a.is_leader()
    first = spec(plane, "renewed")
    assert (first["holderIdentity"], first["leaseTransitions"]) == ("a", 0)
    assert first["leaseDurationSeconds"] == 15 and first["acquireTime"] == first["renewTime"]
    time.sleep(0.01)
    assert a.try_acquire()
    second = spec(plane, "renewed")
    assert second["acquireTime"] == first["acquireTime"] and second["leaseTransitions"] == 0
    assert second["renewTime"] > first["renewTime"]


def test_a_standby_waits_for_the_lease_to_expire_then_takes_it(plane: ControlPlane) -> None:
    a = elector(plane, "expiring", "a", duration=1)
    b = elector(plane, "expiring", "b", duration=1)
    assert a.try_acquire()
    assert not b.try_acquire() and not b.is_leader()
    time.sleep(1.1)
    assert not a.is_leader()  # it could not renew in time: it stops leading on its own
    assert b.try_acquire() and b.is_leader()
    taken = spec(plane, "expiring")
    assert (taken["holderIdentity"], taken["leaseTransitions"]) == ("b", 1)
    assert taken["acquireTime"] == taken["renewTime"]
    assert not a.try_acquire() and not a.is_leader()  # b's Lease is fresh: a stays out


def test_replicas_racing_for_a_free_or_expired_lease_elect_exactly_one(
    plane: ControlPlane,
) -> None:
    electors = [elector(plane, "raced", f"r{i}", duration=1) for i in range(6)]

    def race() -> list[bool]:
        barrier = threading.Barrier(len(electors))

        def go(e: LeaderElector) -> bool:
            barrier.wait()
            return e.try_acquire()

        with ThreadPoolExecutor(len(electors)) as pool:
            return list(pool.map(go, electors))

    first = race()  # no Lease yet: one create wins, the others get 409 or see it taken
    assert first.count(True) == 1
    assert spec(plane, "raced")["holderIdentity"] == f"r{first.index(True)}"
    time.sleep(1.1)
    second = race()  # expired: one update wins on the resourceVersion, the others get 409
    assert second.count(True) == 1
    after = spec(plane, "raced")
    assert after["holderIdentity"] == f"r{second.index(True)}"
    assert after["leaseTransitions"] == (0 if second == first else 1)


def test_running_replicas_never_lead_together_and_hand_over(
    plane: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    replicas = [elector(plane, "running", name, duration=2, renew=0.3) for name in ("a", "b")]
    with caplog.at_level(logging.INFO, "hcsd.cluster.leader"):
        for replica in replicas:
            replica.start()
        deadline = time.monotonic() + 3
        leaders: set[str] = set()
        while time.monotonic() < deadline:
            leading = [r.identity for r in replicas if r.is_leader()]
            assert len(leading) <= 1
            leaders.update(leading)
            time.sleep(0.02)
        (leader,) = leaders  # the first one kept it by renewing
        old = next(r for r in replicas if r.identity == leader)
        new = next(r for r in replicas if r.identity != leader)
        old.stop()  # dies without giving the Lease back
        deadline = time.monotonic() + 5
        while not new.is_leader():
            assert not (old.is_leader() and new.is_leader())
            assert time.monotonic() < deadline, "the standby did not take over"
            time.sleep(0.02)
        new.stop(wait=5)  # its round logs "acquired" before the log level is put back
    assert f"{leader} acquired leadership" in caplog.text
    assert f"{new.identity} acquired leadership" in caplog.text
    assert spec(plane, "running")["holderIdentity"] == new.identity


def test_a_replica_that_stops_gives_the_lease_back_and_a_standby_takes_it_at_once(
    plane: ControlPlane,
) -> None:
    a = elector(plane, "released", "a", duration=60, renew=0.2).start()
    b = elector(plane, "released", "b", duration=60)
    deadline = time.monotonic() + 10
    while not a.is_leader():
        assert time.monotonic() < deadline, "a never led"
        time.sleep(0.05)
    assert not b.try_acquire()  # held for a minute
    assert a.release() and not a.is_leader()
    free = spec(plane, "released")
    assert free["holderIdentity"] == "" and free["leaseDurationSeconds"] == 1
    assert b.try_acquire() and b.is_leader()  # no minute's wait
    taken = spec(plane, "released")
    assert (taken["holderIdentity"], taken["leaseTransitions"]) == ("b", 1)
    time.sleep(0.5)  # a's renewing thread has ended: it does not take the Lease back
    assert spec(plane, "released")["holderIdentity"] == "b"
    # a replica that does not hold the Lease leaves it as it is
    assert not a.release()
    assert spec(plane, "released")["holderIdentity"] == "b"


def test_a_replica_gives_back_only_the_lease_it_last_wrote(plane: ControlPlane) -> None:
    """Another writer under the same identity (a replica started again with the pod's name)
    renewed the Lease after this replica: releasing it would take it from that writer."""
    a = elector(plane, "rewritten", "a", duration=60, renew=60).start()
    deadline = time.monotonic() + 10
    while not a.is_leader():
        assert time.monotonic() < deadline, "a never led"
        time.sleep(0.05)
    again = elector(plane, "rewritten", "a", duration=60)
    assert again.try_acquire()  # the same identity renews it: a newer version
    renewed = spec(plane, "rewritten")
    assert not a.release()
    assert spec(plane, "rewritten") == renewed  # left with the writer that holds it
    assert again.release()
    assert spec(plane, "rewritten")["holderIdentity"] == ""
