"""The brakes on hcs-controller: how fast it may evict, when it must stop, when it may start.

A controller that evicts on what nodes report is as dangerous as the worst report: a driver
roll-out that marks every device unhealthy, a monitoring bug, a hostile node. So:
- a token bucket bounds evictions per minute (burst: one minute's worth);
- a circuit breaker stops every eviction and taint while more than a share of the cluster's
  nodes (whole nodes bad, by the taint policy) or devices are bad: that is an outage to look
  at, not a failed card to isolate; a metric and an alert say so;
- a device must have been reported bad for `min_bad_seconds` before anything is done about
  it (one flapping report is no failure);
- `dry_run` decides and says, and writes nothing.
Pure and clock-injected, so each brake is a test in tests/unit/test_healer_limits.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hcsd.cluster.healer_policy import Fault, Policy, device_count, should_taint

__all__ = ["Breaker", "Debounce", "Limits", "TokenBucket", "breaker_state"]


@dataclass(frozen=True, slots=True)
class Limits:
    """The operator's brakes (hcs-controller's flags, the chart's `controller` values)."""

    evictions_per_minute: float = 10.0
    # Stop acting when more than this share of nodes or devices is bad (1.0: never).
    breaker_share: float = 0.5
    min_bad_seconds: float = 10.0
    dry_run: bool = False

    def __post_init__(self) -> None:
        if self.evictions_per_minute <= 0:
            raise ValueError(f"evictions per minute must be > 0, not {self.evictions_per_minute}")
        if not 0.0 < self.breaker_share <= 1.0:
            raise ValueError(f"breaker share must be in (0, 1], not {self.breaker_share}")
        if self.min_bad_seconds < 0:
            raise ValueError(f"min bad seconds must be >= 0, not {self.min_bad_seconds}")


@dataclass(slots=True)
class TokenBucket:
    """`rate` tokens a minute, at most `rate` held (a minute's burst); starts full."""

    rate: float
    tokens: float = -1.0
    at: float | None = None

    def take(self, now: float) -> bool:
        burst = max(1.0, self.rate)
        if self.at is None or self.tokens < 0:
            self.tokens, self.at = burst, now
        self.tokens = min(burst, self.tokens + (now - self.at) * self.rate / 60.0)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass(frozen=True, slots=True)
class Breaker:
    """The cluster's share of bad nodes and devices, and whether that stops the controller."""

    bad_nodes: int
    nodes: int
    bad_devices: int
    devices: int
    open: bool

    @property
    def summary(self) -> str:
        return (
            f"{self.bad_nodes} of {self.nodes} nodes and "
            f"{self.bad_devices} of {self.devices} devices are bad"
        )


def breaker_state(
    nodes: Iterable[Mapping[str, Any]],
    bad: Mapping[str, Mapping[str, Fault]],
    policy: Policy,
    limits: Limits,
) -> Breaker:
    """Counted over nodes with accelerators; `bad` maps a node's name to its faults."""
    counted = [n for n in nodes if device_count(n) > 0]
    bad_nodes = bad_devices = devices = 0
    for node in counted:
        found = bad.get(str((node.get("metadata") or {}).get("name", ""))) or {}
        devices += device_count(node)
        bad_devices += len(found)
        bad_nodes += should_taint(node, len(found), policy)
    share = limits.breaker_share
    is_open = share < 1.0 and (
        (bool(counted) and bad_nodes / len(counted) > share)
        or (devices > 0 and bad_devices / devices > share)
    )
    return Breaker(bad_nodes, len(counted), bad_devices, devices, is_open)


@dataclass(slots=True)
class Debounce:
    """When each (node, device) was first seen bad, so that it is acted on only once it has
    been bad `min_bad_seconds`; devices seen good again are forgotten."""

    seconds: float
    since: dict[tuple[str, str], float] = field(default_factory=dict)

    def ripe(self, node: str, found: Mapping[str, Fault], now: float) -> dict[str, Fault]:
        for key in [k for k in self.since if k[0] == node and k[1] not in found]:
            del self.since[key]
        ready: dict[str, Fault] = {}
        for uuid, fault in found.items():
            first = self.since.setdefault((node, uuid), now)
            if now - first >= self.seconds:
                ready[uuid] = fault
        return ready

    def prune(self, nodes: Iterable[str]) -> None:
        """Forget nodes that are gone."""
        keep = set(nodes)
        self.since = {k: v for k, v in self.since.items() if k[0] in keep}
