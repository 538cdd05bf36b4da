"""The analyzer under a controlled clock: degrade fast, recover slowly, no flapping."""

from __future__ import annotations

import collections
import itertools
import random
import time
from dataclasses import replace

import pytest

from hcsd.health.analyzer import DeviceHealth, HealthAnalyzer
from hcsd.health.events import HealthEvent, Severity
from hcsd.health.settings import HealthSection
from hcsd.model import HealthState

QUIET = 600.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def analyzer(clock: Clock) -> HealthAnalyzer:
    return HealthAnalyzer(HealthSection(quiet_period=QUIET).analyzer_settings(), clock, ["gpu"])


def event(severity: Severity, code: str = "x") -> HealthEvent:
    return HealthEvent("0000:17:00.0", "nvidia", code, severity, "line", 0.0)


def test_fatal_is_unhealthy_at_once_and_stays_for_the_quiet_period(
    analyzer: HealthAnalyzer, clock: Clock
) -> None:
    assert analyzer.observe("gpu", event(Severity.FATAL, "xid-79")) is HealthState.UNHEALTHY
    assert analyzer.score("gpu") == 0
    clock.advance(QUIET - 1)
    assert analyzer.tick() == [] and analyzer.state("gpu") is HealthState.UNHEALTHY
    clock.advance(1)
    assert analyzer.tick() == ["gpu"]
    assert analyzer.state("gpu") is HealthState.HEALTHY
    assert analyzer.reason("gpu") == ""


def test_application_faults_are_ignored(analyzer: HealthAnalyzer) -> None:
    for _ in range(50):
        analyzer.observe("gpu", event(Severity.APPLICATION, "xid-13"))
    assert analyzer.state("gpu") is HealthState.HEALTHY and analyzer.score("gpu") == 100
    assert analyzer.ignored["xid-13"] == 50


def test_degrading_event_then_probation(analyzer: HealthAnalyzer, clock: Clock) -> None:
    assert analyzer.observe("gpu", event(Severity.DEGRADING, "ring-timeout")) is (
        HealthState.DEGRADED
    )
    assert "ring-timeout" in analyzer.reason("gpu")
    # The score is back above the threshold long before the quiet period ends: still degraded.
    clock.advance(QUIET * 0.5)
    analyzer.tick()
    assert analyzer.score("gpu") == 100
    assert analyzer.state("gpu") is HealthState.DEGRADED
    clock.advance(QUIET * 0.5)
    analyzer.tick()
    assert analyzer.state("gpu") is HealthState.HEALTHY


def test_repeated_degrading_events_make_it_unhealthy(analyzer: HealthAnalyzer) -> None:
    analyzer.observe("gpu", event(Severity.DEGRADING))
    analyzer.observe("gpu", event(Severity.DEGRADING))
    assert analyzer.observe("gpu", event(Severity.DEGRADING)) is HealthState.UNHEALTHY


def test_no_flapping_under_intermittent_faults(analyzer: HealthAnalyzer, clock: Clock) -> None:
    """A fault every half quiet period keeps the device degraded: it never bounces back."""
    states = []
    for _ in range(20):
        analyzer.observe("gpu", event(Severity.DEGRADING))
        for _ in range(30):
            clock.advance(QUIET / 60)
            analyzer.tick()
            states.append(analyzer.state("gpu"))
    assert HealthState.HEALTHY not in states
    transitions = sum(1 for a, b in itertools.pairwise(states) if a is not b)
    assert transitions <= 2


def test_rising_correctable_rate_degrades_before_failure(
    analyzer: HealthAnalyzer, clock: Clock
) -> None:
    # A trickle: one correctable error every 10 minutes does nothing lasting.
    for _ in range(6):
        analyzer.observe("gpu", event(Severity.CORRECTABLE, "xid-92"))
        clock.advance(600)
        analyzer.tick()
    assert analyzer.state("gpu") is HealthState.HEALTHY
    # Then a burst: five in a minute is a rising trend.
    for _ in range(5):
        analyzer.observe("gpu", event(Severity.CORRECTABLE, "xid-92"))
        clock.advance(12)
    assert analyzer.state("gpu") is HealthState.DEGRADED
    assert "rising" in analyzer.reason("gpu")


class RecountingAnalyzer(HealthAnalyzer):
    """The trend rule as first written: recount the whole window for every event (O(n))."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.windows: dict[int, collections.deque[float]] = {}

    def _trend_penalty(self, health: DeviceHealth, now: float) -> float:
        s = self.settings
        window = self.windows.setdefault(id(health), collections.deque())
        window.append(now)
        while window and window[0] < now - 2 * s.trend_window:
            window.popleft()
        recent = sum(1 for t in window if t >= now - s.trend_window)
        earlier = len(window) - recent
        if recent >= s.trend_min_events and recent >= 2 * max(earlier, 1):
            health.last_fault = now
            health.reason = (
                f"correctable errors rising: {recent} in the last window, {earlier} before"
            )
            return s.trend_penalty
        return 0.0


@pytest.mark.parametrize("seed", range(5))
def test_same_decisions_as_recounting_the_window(seed: int) -> None:
    """Bursts, trickles and long silences on two devices: every output is the same."""
    rng = random.Random(seed)
    clock = Clock()
    settings = replace(HealthSection(quiet_period=QUIET).analyzer_settings(), trend_window=60.0)
    devices = ["gpu0", "gpu1"]
    fast = HealthAnalyzer(settings, clock, devices)
    slow = RecountingAnalyzer(settings, clock, devices)
    severities = [Severity.CORRECTABLE] * 40 + [Severity.DEGRADING, Severity.APPLICATION]
    severities += [Severity.FATAL] * (seed % 2)
    for step in range(6_000):
        phase = (step // 500) % 4  # burst, trickle, silence-then-burst, mixed
        gap = {0: 0.05, 1: 15.0, 2: 0.5, 3: 3.0}[phase]
        clock.advance(rng.expovariate(1 / gap) + (200.0 if rng.random() < 0.002 else 0.0))
        if rng.random() < 0.1:
            assert fast.tick() == slow.tick()
        else:
            uuid = rng.choice(devices)
            got = event(rng.choice(severities), "xid-92")
            assert fast.observe(uuid, got) is slow.observe(uuid, got), step
        for uuid in devices:
            assert (fast.state(uuid), fast.score(uuid), fast.reason(uuid)) == (
                slow.state(uuid),
                slow.score(uuid),
                slow.reason(uuid),
            ), step


def test_event_cost_does_not_grow_with_the_window(clock: Clock) -> None:
    """20,000 correctable errors in the window: each further one must not recount them."""
    analyzer = HealthAnalyzer(HealthSection().analyzer_settings(), clock, ["gpu"])
    correctable = event(Severity.CORRECTABLE, "xid-92")
    for _ in range(20_000):
        clock.advance(0.001)
        analyzer.observe("gpu", correctable)
    started = time.perf_counter()
    for _ in range(2_000):
        clock.advance(0.001)
        analyzer.observe("gpu", correctable)
    elapsed = time.perf_counter() - started
    # Recounting costs ~1 ms per event here (2 s in all); O(1) takes a few ms in all.
    assert elapsed < 0.2, f"{elapsed / 2_000 * 1e6:.0f} us per event"
