"""Sub-health: signals read from their evidence, and the tracker's hold, recovery and no-flap
rules under a controlled clock."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hcsd.discovery.pci import read_function
from hcsd.health import signals
from hcsd.health.events import HealthEvent, Severity
from hcsd.health.settings import HealthSection
from hcsd.health.signals import Signal
from hcsd.health.subhealth import SubHealth, SubHealthTracker
from hcsd.model import Device, Vendor
from hcsd.profiles.database import default_database
from tests.fakes import Function, make_sysfs

HOLD, RECOVERY = 300.0, 120.0
SLOW = Signal("hw-slowdown", "clock event reasons 0x8")
SEEN = {"hw-slowdown": SLOW}
ABSENT: dict[str, Signal | None] = {"hw-slowdown": None}
UNKNOWN: dict[str, Signal | None] = {}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def tracker(clock: Clock) -> SubHealthTracker:
    return SubHealthTracker(HOLD, RECOVERY, clock)


def run(
    tracker: SubHealthTracker, clock: Clock, seconds: float, seen: dict[str, Signal | None]
) -> None:
    """Checks every 5 s for `seconds`, the same evidence each time."""
    for _ in range(int(seconds // 5)):
        clock.now += 5
        tracker.update("gpu", seen)


def test_degraded_after_the_hold_not_before(tracker: SubHealthTracker, clock: Clock) -> None:
    assert not tracker.update("gpu", SEEN)
    run(tracker, clock, HOLD - 5, SEEN)
    assert tracker.reasons("gpu") == ()  # 295 s: not yet
    clock.now += 5
    assert tracker.update("gpu", SEEN)  # 300 s: counts, and that is a change
    assert tracker.held("gpu") == (SLOW,)


def test_a_gap_before_the_hold_starts_it_again(tracker: SubHealthTracker, clock: Clock) -> None:
    tracker.update("gpu", SEEN)
    run(tracker, clock, HOLD - 10, SEEN)
    run(tracker, clock, 5, ABSENT)  # one clean reading
    run(tracker, clock, HOLD, SEEN)  # seen first at the start of these 300 s: 295 s held
    assert tracker.reasons("gpu") == ()
    run(tracker, clock, 5, SEEN)
    assert tracker.reasons("gpu") == ("hw-slowdown",)


def test_clears_after_the_recovery_time_and_does_not_flap(
    tracker: SubHealthTracker, clock: Clock
) -> None:
    tracker.update("gpu", SEEN)
    run(tracker, clock, HOLD, SEEN)
    assert tracker.reasons("gpu") == ("hw-slowdown",)
    # comes and goes: every other minute for ten minutes, degraded all along
    for _ in range(5):
        run(tracker, clock, 60, ABSENT)
        assert tracker.reasons("gpu") == ("hw-slowdown",)
        run(tracker, clock, 60, SEEN)
        assert tracker.reasons("gpu") == ("hw-slowdown",)
    run(tracker, clock, RECOVERY - 5, ABSENT)
    assert tracker.reasons("gpu") == ("hw-slowdown",)
    clock.now += 5
    assert tracker.update("gpu", ABSENT)
    assert tracker.held("gpu") == ()


def test_the_latest_detail_is_kept(tracker: SubHealthTracker, clock: Clock) -> None:
    tracker.update("gpu", SEEN)
    run(tracker, clock, HOLD, {"hw-slowdown": replace(SLOW, detail="clock event reasons 0x48")})
    assert tracker.held("gpu")[0].detail == "clock event reasons 0x48"


def test_unknown_freezes_a_degraded_device(tracker: SubHealthTracker, clock: Clock) -> None:
    """A hung card (the backend timed out, no readings) stays degraded: missing evidence is
    not the signal gone."""
    tracker.update("gpu", SEEN)
    run(tracker, clock, HOLD, SEEN)
    run(tracker, clock, RECOVERY * 3, UNKNOWN)
    assert tracker.reasons("gpu") == ("hw-slowdown",)
    # found absent for RECOVERY s; the first of these checks follows an unknown stretch,
    # which is not credited as recovery
    run(tracker, clock, RECOVERY, ABSENT)
    assert tracker.reasons("gpu") == ("hw-slowdown",)
    run(tracker, clock, 5, ABSENT)
    assert tracker.reasons("gpu") == ()


def test_unknown_freezes_a_hold(tracker: SubHealthTracker, clock: Clock) -> None:
    """A signal judged only under load, with idle polls in between: the hold pauses, it
    neither breaks nor counts the idle time."""
    tracker.update("gpu", SEEN)
    run(tracker, clock, 30, SEEN)  # 30 s held
    for _ in range(10):
        run(tracker, clock, 60, UNKNOWN)
        run(tracker, clock, 30, SEEN)  # 25 s more: the interval after an unknown is not
    assert tracker.reasons("gpu") == ()  # 280 s seen (and 600 s unknown)
    run(tracker, clock, 60, UNKNOWN)
    run(tracker, clock, 30, SEEN)
    assert tracker.reasons("gpu") == ("hw-slowdown",)  # 305 s seen, in pieces


def test_the_hold_is_keyed_on_the_kind(tracker: SubHealthTracker, clock: Clock) -> None:
    """A link alternating x8 and x4 is one signal that holds, with the latest figures."""
    x8 = {"pcie-link-width": Signal("pcie-link-width", "PCIe link x8")}
    x4 = {"pcie-link-width": Signal("pcie-link-width", "PCIe link x4")}
    tracker.update("gpu", x8)
    for _ in range(int(HOLD // 10)):
        run(tracker, clock, 5, x4)
        run(tracker, clock, 5, x8)
    assert tracker.held("gpu") == (Signal("pcie-link-width", "PCIe link x8"),)


def test_snapshot_and_restore_keep_the_holds(clock: Clock) -> None:
    first = SubHealthTracker(HOLD, RECOVERY, clock)
    first.update("gpu", SEEN)
    run(first, clock, HOLD, SEEN)
    clock.now = 5.0  # a restart: a new monotonic clock
    second = SubHealthTracker(HOLD, RECOVERY, clock)
    second.restore(first.snapshot())
    assert second.held("gpu") == (SLOW,)
    run(second, clock, RECOVERY - 5, ABSENT)  # the restart gap is not credited
    assert second.reasons("gpu") == ("hw-slowdown",)


def link(tmp_path: Path, width: int, top: int, speed: str, fastest: str) -> object:
    extra = {"max_link_width": str(top), "max_link_speed": fastest}
    sysfs = make_sysfs(
        tmp_path / "sys",
        [Function("0000:3b:00.0", 0x1D94, 0x6210, width=width, speed=speed, extra=extra)],
    )
    return read_function(sysfs, "0000:3b:00.0")


def seen(evidence: dict[str, Signal | None]) -> list[str]:
    return [kind for kind, signal in evidence.items() if signal is not None]


W, S = "pcie-link-width", "pcie-link-speed"
GEN4, GEN3, GEN1 = "16.0 GT/s PCIe", "8.0 GT/s PCIe", "2.5 GT/s PCIe"


@pytest.mark.parametrize(
    ("width", "speed", "busy", "dynamic", "evidence"),
    [
        pytest.param(16, GEN4, True, True, {W: False, S: False}, id="full-link"),
        pytest.param(8, GEN4, None, False, {W: True}, id="down-trained"),
        pytest.param(8, GEN4, None, True, {}, id="dynamic-width-unknown-load"),
        pytest.param(8, GEN4, False, True, {}, id="dynamic-width-idle"),
        pytest.param(8, GEN4, True, True, {W: True, S: False}, id="dynamic-width-busy"),
        pytest.param(16, GEN1, False, False, {W: False}, id="idle-low-speed-is-power-saving"),
        pytest.param(16, GEN1, None, False, {W: False}, id="unknown-load-speed-not-judged"),
        pytest.param(4, GEN3, True, False, {W: True, S: True}, id="both"),
    ],
)
def test_pcie_link_from_sysfs(
    tmp_path: Path,
    width: int,
    speed: str,
    busy: bool | None,
    dynamic: bool,
    evidence: dict[str, bool],
) -> None:
    function = link(tmp_path, width, 16, speed, "16.0 GT/s PCIe")
    found = signals.pcie_link(function, busy=busy, dynamic=dynamic)  # type: ignore[arg-type]
    assert {kind: signal is not None for kind, signal in found.items()} == evidence


def bridged(tmp_path: Path, port: dict[str, str], device: dict[str, str]) -> Path:
    """A fake sysfs as the kernel lays it out: the function under its upstream bridge in
    /sys/devices, linked from /sys/bus/pci/devices."""
    sys = tmp_path / "sys"
    bridge = sys / "devices" / "pci0000:00" / "0000:00:01.0"
    function = bridge / "0000:3b:00.0"
    function.mkdir(parents=True)
    files = {"vendor": "0x10de", "device": "0x2330", "class": "0x030200", **device}
    for directory, values in ((bridge, port), (function, files)):
        for name, text in values.items():
            (directory / name).write_text(text + "\n")
    (sys / "bus" / "pci" / "devices").mkdir(parents=True)
    (sys / "bus" / "pci" / "devices" / "0000:3b:00.0").symlink_to(function)
    return sys


GEN5_X16 = {
    "current_link_speed": "16.0 GT/s PCIe",
    "current_link_width": "16",
    "max_link_speed": "32.0 GT/s PCIe",
    "max_link_width": "16",
}


def test_the_link_is_judged_against_the_upstream_port(tmp_path: Path) -> None:
    """A Gen5 card in a Gen4 slot runs at Gen4 by design: no signal, even busy."""
    gen4 = {"max_link_speed": "16.0 GT/s PCIe", "max_link_width": "16"}
    function = read_function(bridged(tmp_path, gen4, GEN5_X16), "0000:3b:00.0")
    assert function is not None
    assert (function.link_cap_speed, function.link_cap_width) == (16.0, 16)
    assert seen(signals.pcie_link(function, busy=True, dynamic=True)) == []


def test_an_x8_wired_slot_and_a_slow_link_behind_a_full_port(tmp_path: Path) -> None:
    x8 = {"max_link_speed": "32.0 GT/s PCIe", "max_link_width": "8"}
    card = {**GEN5_X16, "current_link_width": "8", "current_link_speed": "32.0 GT/s PCIe"}
    function = read_function(bridged(tmp_path, x8, card), "0000:3b:00.0")
    assert seen(signals.pcie_link(function, busy=True, dynamic=True)) == []
    full = {"max_link_speed": "32.0 GT/s PCIe", "max_link_width": "16"}
    function = read_function(bridged(tmp_path / "b", full, GEN5_X16), "0000:3b:00.0")
    assert seen(signals.pcie_link(function, busy=True, dynamic=True)) == ["pcie-link-speed"]


@pytest.mark.parametrize(
    ("gauges", "reasons"),
    [
        pytest.param({}, [], id="no-readings"),
        pytest.param({"clock_event_reasons": 0x0}, [], id="nothing"),
        pytest.param({"clock_event_reasons": 0x1 | 0x2 | 0x4 | 0x10}, [], id="normal-bits"),
        pytest.param({"clock_event_reasons": 0x8}, ["hw-slowdown"], id="hw-slowdown"),
        pytest.param(
            {"clock_event_reasons": 0x40 | 0x80},
            ["hw-thermal-slowdown", "hw-power-brake"],
            id="thermal-and-brake",
        ),
        pytest.param({"clock_event_reasons": 0x20}, ["sw-thermal-slowdown"], id="sw-thermal"),
        pytest.param(
            {"clock_event_reasons": 0, "sm_clock_mhz": 600, "sm_clock_max_mhz": 1410, "busy": 1},
            ["sm-clock-low"],
            id="low-clock-unexplained",
        ),
        pytest.param(
            {"clock_event_reasons": 0, "sm_clock_mhz": 600, "sm_clock_max_mhz": 1410, "busy": 0},
            [],
            id="low-clock-not-busy",
        ),
        *(
            pytest.param(
                {
                    "clock_event_reasons": bit,
                    "sm_clock_mhz": 600,
                    "sm_clock_max_mhz": 1410,
                    "busy": 1,
                },
                [],
                id=f"low-clock-explained-{bit:#x}",
            )
            for bit in (0x10, 0x100, 0x200, 0x400)
        ),
        pytest.param(
            {
                "clock_event_reasons": 0x2,
                "sm_clock_mhz": 800,
                "sm_clock_max_mhz": 1410,
                "sm_clock_applications_mhz": 810,
                "busy": 1,
            },
            [],
            id="at-the-application-clock",
        ),
        pytest.param(
            {
                "clock_event_reasons": 0x2,
                "sm_clock_mhz": 400,
                "sm_clock_max_mhz": 1410,
                "sm_clock_applications_mhz": 1200,
                "busy": 1,
            },
            ["sm-clock-low"],
            id="far-under-the-application-clock",
        ),
        pytest.param(
            {"clock_event_reasons": 0x1, "sm_clock_mhz": 210, "sm_clock_max_mhz": 1410},
            [],
            id="low-clock-idle",
        ),
        pytest.param(
            {"clock_event_reasons": 0x4, "sm_clock_mhz": 600, "sm_clock_max_mhz": 1410},
            [],
            id="low-clock-power-cap",
        ),
        pytest.param(
            {"clock_event_reasons": 0x8, "sm_clock_mhz": 600, "sm_clock_max_mhz": 1410},
            ["hw-slowdown"],
            id="low-clock-named",
        ),
        pytest.param(
            {"clock_event_reasons": 0, "sm_clock_mhz": 1300, "sm_clock_max_mhz": 1410},
            [],
            id="clock-near-max",
        ),
    ],
)
def test_clocks(gauges: dict[str, int], reasons: list[str]) -> None:
    assert seen(signals.clocks(gauges, low_ratio=0.6)) == reasons


def test_a_clock_reason_clears_only_under_load() -> None:
    """Bits seen count whatever the load; their absence only while busy."""
    assert signals.clocks({"clock_event_reasons": 0, "busy": 0}, low_ratio=0.6) == {}
    assert signals.clocks({"clock_event_reasons": 0}, low_ratio=0.6) == {}
    busy = signals.clocks({"clock_event_reasons": 0, "busy": 1}, low_ratio=0.6)
    assert set(busy) == set(signals.LOAD_CLOCK_KINDS) - {"sm-clock-low"}
    assert all(v is None for v in busy.values())
    idle = signals.clocks({"clock_event_reasons": 0x80, "busy": 0}, low_ratio=0.6)
    assert seen(idle) == ["hw-power-brake"]
    # a vendor that never reports load (CNDev): a bit's absence counts whenever read
    ungated = signals.clocks({"clock_event_reasons": 0}, low_ratio=0.6, load_gated=False)
    assert set(ungated) == set(signals.LOAD_CLOCK_KINDS) - {"sm-clock-low"}


def test_busy_only_where_the_vendor_says() -> None:
    assert signals.busy({}) is None  # CNDev, DCMI: unknown, so the link speed is not judged
    assert signals.busy({"busy": 0}) is False
    assert signals.busy({"busy": 1}) is True


def test_memory_pending_and_ecc_rising() -> None:
    assert seen(signals.memory_pending({"row_remap_pending": 1})) == ["row-remap-pending"]
    assert signals.memory_pending({"retired_pages_pending": 0}) == {"retired-pages-pending": None}
    assert signals.memory_pending({}) == {}  # no reading: unknown
    assert seen(signals.ecc_rising(None, 0, now=100.0, window=60.0)) == []
    assert seen(signals.ecc_rising(50.0, 3, now=100.0, window=60.0)) == ["ecc-correctable-rising"]
    assert seen(signals.ecc_rising(30.0, 3, now=100.0, window=60.0)) == []


def test_measured_tflops_against_the_profile() -> None:
    database = default_database()
    a100 = Device(
        "gpu",
        Vendor.NVIDIA,
        "A100-SXM4-80GB",
        0,
        "0000:17:00.0",
        80 * 2**30,
        tflops_fp16=312.0,
        attributes=(("profile", "nvidia/A100-SXM4-80GB"),),
    )
    assert signals.tflops_ratio(a100, database) is None  # profile figures: nothing measured
    slow = replace(
        a100, tflops_fp16=200.0, attributes=(*a100.attributes, ("fingerprint", "measured"))
    )
    ratio = signals.tflops_ratio(slow, database)
    assert ratio == pytest.approx(200 / 312)
    assert seen(signals.below_profile(ratio, threshold=0.8)) == ["below-profile-tflops"]
    assert seen(signals.below_profile(0.9, threshold=0.8)) == []
    unknown = replace(slow, attributes=(("profile", "unknown"), ("fingerprint", "measured")))
    assert signals.tflops_ratio(unknown, database) is None


@pytest.mark.parametrize(
    ("code", "severity", "counts"),
    [
        pytest.param("ecc_correctable", Severity.CORRECTABLE, True, id="nvml-dcmi-cndev-counter"),
        pytest.param("xid-92", Severity.CORRECTABLE, True, id="xid-92-high-sbe-rate"),
        pytest.param("hbm-ecc", Severity.CORRECTABLE, True, id="ascend-hbm-ecc-line"),
        pytest.param("aer-correctable", Severity.CORRECTABLE, False, id="pcie-not-memory"),
        pytest.param("xid-48", Severity.FATAL, False, id="fatal-is-the-analyzers"),
    ],
)
def test_corrections_from_counters_and_kernel_lines(
    tmp_path: Path, clock: Clock, code: str, severity: Severity, counts: bool
) -> None:
    settings = HealthSection(subhealth_hold=10.0).subhealth_settings()
    watch = SubHealth(settings, clock, sysfs=str(tmp_path))
    device = Device("gpu", Vendor.NVIDIA, "A100-SXM4-80GB", 0, "", 80 * 2**30)
    for _ in range(3):
        watch.note("gpu", HealthEvent("0000:17:00.0", "nvidia", code, severity, "", 0.0))
        watch.check([device], {})
        clock.now += 5
    assert watch.held("gpu") == (
        (
            Signal(
                "ecc-correctable-rising",
                "3 correctable memory error rise(s) since hcsd started, the latest at most 60s "
                "before the last check",
            ),
        )
        if counts
        else ()
    )


def test_a_failing_source_leaves_the_others_and_warns_once(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """A profile attribute that cannot be parsed (an unknown vendor) used to drop every
    signal of the device on every poll; now only its own kind is unknown."""
    settings = HealthSection(subhealth_hold=10.0).subhealth_settings()
    watch = SubHealth(settings, clock, sysfs=str(tmp_path))
    device = Device(
        "gpu",
        Vendor.NVIDIA,
        "A100-SXM4-80GB",
        0,
        "",
        80 * 2**30,
        tflops_fp16=100.0,
        attributes=(("profile", "foo/bar"), ("fingerprint", "measured")),
    )
    for _ in range(4):
        watch.check([device], {"gpu": {"clock_event_reasons": 0x8, "busy": 1}})
        clock.now += 5
    assert [s.reason for s in watch.held("gpu")] == ["hw-slowdown"]
    warned = [r for r in caplog.records if "sub-health profile of gpu" in r.getMessage()]
    assert len(warned) == 1
    assert "unknown vendor 'foo'" in warned[0].getMessage()


def test_saved_state_survives_a_restart_and_ignores_a_broken_file(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    settings = HealthSection(subhealth_hold=10.0).subhealth_settings()
    path = tmp_path / "run" / "subhealth.json"
    first = SubHealth(settings, clock, sysfs=str(tmp_path), state_path=str(path))
    for _ in range(3):
        first.check([DEVICE], {"gpu": {"clock_event_reasons": 0x8, "busy": 1}})
        clock.now += 5
    assert [s.reason for s in first.held("gpu")] == ["hw-slowdown"]
    second = SubHealth(settings, clock, sysfs=str(tmp_path), state_path=str(path))
    assert [s.reason for s in second.held("gpu")] == ["hw-slowdown"]
    path.write_text("{not json")
    third = SubHealth(settings, clock, sysfs=str(tmp_path), state_path=str(path))
    assert third.held("gpu") == ()
    assert "ignoring sub-health state" in caplog.text


DEVICE = Device("gpu", Vendor.NVIDIA, "A100-SXM4-80GB", 0, "", 80 * 2**30)
