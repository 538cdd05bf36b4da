"""hcs-controller's brakes (hcsd/cluster/healer_limits.py), on an injected clock."""

from __future__ import annotations

from typing import Any

import pytest

from hcsd.cluster.healer_limits import Debounce, Limits, TokenBucket, breaker_state
from hcsd.cluster.healer_policy import Policy, faults
from tests.unit.fleet import node_object


def with_states(obj: dict[str, Any], *states: str) -> dict[str, Any]:
    for device, state in zip(obj["status"]["devices"], states, strict=True):
        device["health"] = state
    return obj


def test_the_bucket_allows_a_minutes_burst_then_its_rate() -> None:
    bucket = TokenBucket(10)
    assert [bucket.take(0.0) for _ in range(11)] == [True] * 10 + [False]
    assert not bucket.take(5.9)  # 0.98 of a token in 5.9 s
    assert bucket.take(6.1)
    assert not bucket.take(6.2)
    assert [bucket.take(600.0) for _ in range(11)].count(True) == 10  # never more than a burst


def test_a_slow_rate_still_allows_one() -> None:
    bucket = TokenBucket(0.5)
    assert bucket.take(0.0) and not bucket.take(60.0) and bucket.take(120.0)


def cluster(*states: tuple[str, ...]) -> list[dict[str, Any]]:
    return [with_states(node_object(f"n{i}", count=len(s)), *s) for i, s in enumerate(states)]


@pytest.mark.parametrize(
    ("states", "is_open"),
    [
        ((("unhealthy", "healthy"), ("healthy", "healthy"), ("healthy", "healthy")), False),
        # one dead node of three: a third of the nodes, a third of the devices
        ((("lost", "lost"), ("healthy", "healthy"), ("healthy", "healthy")), False),
        # two dead nodes of three
        ((("lost", "lost"), ("lost", "unhealthy"), ("healthy", "healthy")), True),
        # no node dead, but more than half of the devices
        ((("lost", "healthy"), ("unhealthy", "healthy"), ("lost", "lost")), True),
        # exactly half: not more than half
        ((("lost", "healthy"), ("unhealthy", "healthy")), False),
    ],
)
def test_the_breaker_opens_over_the_share_of_nodes_or_devices(
    states: tuple[tuple[str, ...], ...], is_open: bool
) -> None:
    nodes = cluster(*states)
    bad = {n["metadata"]["name"]: faults(n, Policy()) for n in nodes}
    state = breaker_state(nodes, bad, Policy(), Limits())
    assert state.open is is_open, state.summary
    assert not breaker_state(nodes, bad, Policy(), Limits(breaker_share=1.0)).open  # off


def test_a_node_without_accelerators_is_not_counted() -> None:
    nodes = [*cluster(("lost", "healthy")), node_object("cpu", count=0)]
    bad = {n["metadata"]["name"]: faults(n, Policy()) for n in nodes}
    state = breaker_state(nodes, bad, Policy(), Limits())
    assert (state.nodes, state.devices, state.bad_devices) == (1, 2, 1)


def test_a_device_is_acted_on_only_once_bad_for_the_minimum() -> None:
    (node,) = cluster(("unhealthy", "healthy"))
    bad = faults(node, Policy())
    debounce = Debounce(10.0)
    assert debounce.ripe("n0", bad, 100.0) == {}
    assert debounce.ripe("n0", bad, 109.9) == {}
    assert debounce.ripe("n0", bad, 110.0) == bad
    assert debounce.ripe("n0", {}, 111.0) == {}  # good again: forgotten
    assert debounce.ripe("n0", bad, 112.0) == {}  # bad again: the wait starts over
    debounce.prune(["other"])
    assert debounce.since == {}


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"evictions_per_minute": 0}, "evictions per minute"),
        ({"breaker_share": 0}, "breaker share"),
        ({"min_bad_seconds": -1}, "min bad seconds"),
    ],
)
def test_bad_limits_are_refused(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Limits(**kwargs)
