"""Per-device health score and state: degrade fast, recover slowly, never flap.

Score 0..100 per device. Events cost points at once (a fatal one all of them); silence earns
them back linearly, 100 points per `quiet_period`. The state follows the score with hysteresis:
- UNHEALTHY while a fatal event is younger than `quiet_period`, or the score is below
  `unhealthy_below`;
- DEGRADED below `degraded_below`, and it stays DEGRADED until the score is back above
  `recovered_above` *and* the last fault is older than `quiet_period`;
- HEALTHY otherwise.
A rising rate of correctable errors (this trend window against the previous one) costs extra
points, so a device that is about to fail is degraded before it does.
The clock is injected: tests drive time, the daemon passes time.monotonic. It must not go
backwards: the trend window relies on events arriving in time order.

Every event costs O(1) amortised, whatever the rate: the trend window keeps its timestamps in
two queues (this window, the one before) whose lengths are the counts, and each timestamp moves
from one to the next and out at most once; `tick` does the same expiry, so a long quiet spell
is cleared a second at a time rather than all at once by the next event.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field

from hcsd.health.events import HealthEvent, Severity
from hcsd.model import HealthState

__all__ = ["AnalyzerSettings", "DeviceHealth", "HealthAnalyzer", "TrendWindow"]


@dataclass(frozen=True, slots=True)
class AnalyzerSettings:
    """The thresholds come from the config (`HealthSection.analyzer_settings`); the penalties
    are the model's own tuning."""

    quiet_period: float
    degraded_below: float
    recovered_above: float
    unhealthy_below: float
    degrading_penalty: float = 35.0
    correctable_penalty: float = 2.0
    trend_window: float = 600.0
    trend_min_events: int = 5
    trend_penalty: float = 25.0


class TrendWindow:
    """Correctable-error times in the current trend window and in the one before it.

    `recent` holds times >= now - window, `earlier` those in [now - 2 window, now - window);
    the lengths are the counts the trend rule needs, so nothing is ever recounted.
    """

    __slots__ = ("earlier", "recent")

    def __init__(self) -> None:
        self.recent: collections.deque[float] = collections.deque()
        self.earlier: collections.deque[float] = collections.deque()

    def add(self, now: float, window: float) -> None:
        self.recent.append(now)
        self.expire(now, window)

    def expire(self, now: float, window: float) -> None:
        recent, earlier = self.recent, self.earlier
        while recent and recent[0] < now - window:
            earlier.append(recent.popleft())
        while earlier and earlier[0] < now - 2 * window:
            earlier.popleft()


@dataclass(slots=True)
class DeviceHealth:
    score_at: float = 100.0  # score right after the last change
    changed_at: float = 0.0
    state: HealthState = HealthState.HEALTHY
    last_fault: float | None = None
    last_fatal: float | None = None
    reason: str = ""  # in detail: counts, ratios, the kernel's line
    cause: str = ""  # the same in words that do not change while the fault goes on
    trend: TrendWindow = field(default_factory=TrendWindow)


class HealthAnalyzer:
    def __init__(
        self, settings: AnalyzerSettings, clock: Callable[[], float], devices: list[str]
    ) -> None:
        self.settings = settings
        self.clock = clock
        self._devices = {uuid: DeviceHealth(changed_at=clock()) for uuid in devices}
        self.ignored: collections.Counter[str] = collections.Counter()

    def devices(self) -> list[str]:
        return list(self._devices)

    def _health(self, uuid: str) -> DeviceHealth:
        """The device's record, made on first sight: a device hot-plugged back under a new
        uuid is unknown to the list this analyzer started with, and starts healthy."""
        health = self._devices.get(uuid)
        if health is None:
            health = self._devices[uuid] = DeviceHealth(changed_at=self.clock())
        return health

    def score(self, uuid: str, now: float | None = None) -> float:
        health = self._health(uuid)
        now = self.clock() if now is None else now
        recovered = 100.0 * (now - health.changed_at) / self.settings.quiet_period
        return max(0.0, min(100.0, health.score_at + recovered))

    def state(self, uuid: str) -> HealthState:
        return self._health(uuid).state

    def reason(self, uuid: str) -> str:
        """Why the device is not healthy, in detail (for logs and the ComputeNode); "" when
        it is healthy or unknown here."""
        health = self._devices.get(uuid)
        return health.reason if health is not None else ""

    def cause(self, uuid: str) -> str:
        """The reason without its changing details (no counts, ratios, pids or kernel text),
        fit for a metric label: a label that changed with every event would start a new
        series each time and restart an alert's `for:`. "" when healthy or unknown."""
        health = self._devices.get(uuid)
        return health.cause if health is not None else ""

    def observe(self, uuid: str, event: HealthEvent) -> HealthState:
        """Account one event; returns the device's state after it."""
        s = self.settings
        health = self._health(uuid)
        now = self.clock()
        if event.severity is Severity.APPLICATION:
            self.ignored[event.code] += 1
            return health.state
        penalty = {
            Severity.CORRECTABLE: s.correctable_penalty,
            Severity.DEGRADING: s.degrading_penalty,
            Severity.FATAL: 100.0,
        }[event.severity]
        if event.severity is Severity.CORRECTABLE:
            penalty += self._trend_penalty(health, now)
        else:
            health.last_fault = now
            health.reason = f"{event.code}: {event.message[:120]}"
            health.cause = f"{event.code} ({event.severity.name.lower()})"
        if event.severity is Severity.FATAL:
            health.last_fatal = now
        self._set_score(health, self.score(uuid, now) - penalty, now)
        if event.severity is Severity.CORRECTABLE and not health.reason:
            health.reason = health.cause = f"{event.code}: correctable errors"
        return self._update_state(uuid, now)

    def tick(self) -> list[str]:
        """Re-evaluate every device (recovery happens with time); returns devices that changed."""
        now = self.clock()
        changed = []
        for uuid, health in self._devices.items():
            health.trend.expire(now, self.settings.trend_window)
            before = health.state
            if self._update_state(uuid, now) is not before:
                changed.append(uuid)
        return changed

    def _trend_penalty(self, health: DeviceHealth, now: float) -> float:
        s = self.settings
        health.trend.add(now, s.trend_window)
        recent, earlier = len(health.trend.recent), len(health.trend.earlier)
        if recent >= s.trend_min_events and recent >= 2 * max(earlier, 1):
            health.last_fault = now
            health.reason = (
                f"correctable errors rising: {recent} in the last window, {earlier} before"
            )
            health.cause = "correctable errors rising"
            return s.trend_penalty
        return 0.0

    def _set_score(self, health: DeviceHealth, score: float, now: float) -> None:
        health.score_at = max(0.0, score)
        health.changed_at = now

    def _update_state(self, uuid: str, now: float) -> HealthState:
        s = self.settings
        health = self._health(uuid)
        score = self.score(uuid, now)
        quiet = health.last_fault is None or now - health.last_fault >= s.quiet_period
        if (health.last_fatal is not None and now - health.last_fatal < s.quiet_period) or (
            score < s.unhealthy_below
        ):
            state = HealthState.UNHEALTHY
        elif score < s.degraded_below:
            state = HealthState.DEGRADED
        elif health.state is not HealthState.HEALTHY and not (score >= s.recovered_above and quiet):
            state = HealthState.DEGRADED  # on probation: hysteresis and the quiet period
        else:
            state = HealthState.HEALTHY
        if state is HealthState.HEALTHY:
            health.reason = health.cause = ""
        health.state = state
        return state
