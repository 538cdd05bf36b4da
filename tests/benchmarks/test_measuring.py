"""When hcsd measures (hcsd.daemon.measuring): idle devices only, an allocation aborts a
measurement, the schedule, a failing library, and the figure applied and kept."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hcsd.benchmarks import MeasureSection, measured_ratio
from hcsd.benchmarks.store import MeasuredStore
from hcsd.daemon.measuring import Measurer
from hcsd.discovery import Inventory
from hcsd.ledger import Ledger
from hcsd.model import Allocation, Grant, HealthState, PodRef, Vendor
from hcsd.service import NodeService
from tests.benchmarks.conftest import UUIDS, WORKER_ENV, FakeBlas, nvidia

GiB = 2**30


class Node:
    def __init__(self, directory: Path, fake_blas: FakeBlas, **settings: object) -> None:
        self.ledger = Ledger(str(directory / "state"))
        self.ledger.open()
        devices = (nvidia(0), nvidia(1))
        self.service = NodeService(Inventory("n1", devices, ("nvidia",)), self.ledger)
        self.path = directory / "state" / "measured.json"
        self.settings = MeasureSection(
            size=4096,  # milliseconds per GEMM at the fake's speed: the launches never lag
            duration=0.2,
            warmup=0.05,
            copy_mib=1024,
            library_path=(str(fake_blas.build),),
            worker_env=WORKER_ENV,
            **settings,  # type: ignore[arg-type]
        )
        self.now = 1000.0
        self.measurer = self.make_measurer()

    def make_measurer(self) -> Measurer:
        return Measurer(
            self.service,
            self.settings,
            MeasuredStore(str(self.path)),
            vendors=[Vendor.NVIDIA],
            clock=lambda: self.now,
        )

    def hold(self, index: int, container: str = "c1") -> None:
        grant = Grant(UUIDS[index], 8 * GiB)
        pod = PodRef("team-a", "trainer", "uid-1")
        self.service.hold(Allocation(container, (grant,), pod=pod, container_name="main"))

    def on_file(self) -> dict[str, dict[str, object]]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}


@pytest.fixture
def node(tmp_path: Path, fake_blas: FakeBlas) -> Iterator[Node]:
    made = Node(tmp_path, fake_blas)
    yield made
    made.ledger.close()


async def test_a_pass_measures_idle_devices_and_skips_allocated_ones(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    node.hold(1)
    caplog.set_level(logging.INFO, logger="hcsd.daemon.measuring")
    outcomes = await node.measurer.measure()
    assert [(o.uuid, o.status) for o in outcomes] == [(UUIDS[0], "measured"), (UUIDS[1], "skipped")]
    assert outcomes[1].message == "team-a/trainer/main was allocated the device"
    measured = node.service.device(UUIDS[0])
    assert measured is not None
    # the raw figure and how it compares with the profile's 312 are attributes; the device is
    # rated at the profile scaled by that ratio over the model's typical efficiency (0.7)
    attributes = dict(measured.attributes)
    raw = float(attributes["measured_tflops_fp16"])
    assert 24 <= raw <= 40.4
    assert attributes["fingerprint"] == "measured"
    assert measured_ratio(measured) == pytest.approx(raw / 312, abs=1e-3)
    assert measured.tflops_fp16 == pytest.approx(312 * raw / 312 / 0.7, abs=1e-2)
    assert measured.tflops_bf16 == measured.tflops_fp16
    assert (measured.tflops_fp32, measured.tops_int8) == (
        nvidia(0).tflops_fp32,
        nvidia(0).tops_int8,
    )
    assert 300 <= float(attributes["measured_bandwidth_gbps"]) <= 505
    assert node.service.device(UUIDS[1]) == nvidia(1)  # untouched
    entry = node.on_file()[UUIDS[0]]
    assert entry["tflops_fp16"] == pytest.approx(raw, abs=1e-3)
    assert entry["profile_tflops_fp16"] == 312 and UUIDS[1] not in node.on_file()
    line = next(r.getMessage() for r in caplog.records if "FP16 TFLOPS" in r.getMessage())
    assert line.startswith(f"measure: nvidia/0 ({UUIDS[0]}): ")
    assert "of the profile's 312), " in line and "through libcublas.so.12" in line
    assert node.measurer.counts == {"measured": 1, "skipped": 1}


async def test_an_allocation_aborts_the_measurement(
    node: Node, fake_blas: FakeBlas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The allocation wins: the worker is killed as soon as the ledger holds it, and no figure
    is recorded."""
    monkeypatch.setenv("FAKE_CUBLAS_TFLOPS", "0.000001")  # a GEMM that would take half an hour
    loop = asyncio.get_running_loop()
    running = asyncio.ensure_future(node.measurer.measure([UUIDS[0]]))
    while node.measurer.current is None:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    node.hold(0)
    held_at = loop.time()
    (outcome,) = await asyncio.wait_for(running, 5)
    assert loop.time() - held_at < 1
    assert (outcome.status, outcome.message) == (
        "aborted",
        "stopped: team-a/trainer/main was allocated the device",
    )
    assert node.on_file() == {} and node.service.device(UUIDS[0]) == nvidia(0)


async def test_a_failing_library_logs_why_and_records_nothing(
    node: Node, fake_blas: FakeBlas, caplog: pytest.LogCaptureFixture
) -> None:
    broken = (str(fake_blas.build / "nogemm"), str(fake_blas.build))
    node.measurer.settings = replace(node.settings, library_path=broken)
    outcomes = await node.measurer.measure([UUIDS[0]])
    assert [o.status for o in outcomes] == ["failed"]
    assert (
        f"measure: nvidia/0 ({UUIDS[0]}): failed: libcublas.so.12 has no symbol cublasGemmEx; "
        "no figure recorded"
    ) in caplog.messages
    assert node.on_file() == {} and node.service.device(UUIDS[0]) == nvidia(0)
    # a permanent failure keeps the vendor out of the schedule; on demand it is tried again
    node.now += 10 * 86400
    assert node.measurer.due() == []
    again = await node.measurer.measure([UUIDS[1]])
    assert [o.status for o in again] == ["failed"]


async def test_the_start_pass_then_the_schedule_while_idle(node: Node) -> None:
    node.settings = replace(node.settings, interval=3600, idle_for=300)
    node.measurer = node.make_measurer()
    node.hold(1)
    await node.measurer.measure([UUIDS[0]])  # as the start pass does: device 0 measured now
    assert node.measurer.due() == []  # 0 was just measured; 1 is allocated
    node.service.release("c1")
    node.now += 200  # 1 seen busy 200 s ago: not idle long enough
    assert node.measurer.due() == []
    node.now += 200  # idle 400 s > idle_for, and never measured
    assert node.measurer.due() == [UUIDS[1]]
    node.now += 3600  # and device 0's interval has passed too
    assert node.measurer.due() == [UUIDS[0], UUIDS[1]]
    node.hold(0, "c2")
    assert node.measurer.due() == [UUIDS[1]]


def test_no_schedule_with_interval_zero(node: Node) -> None:
    node.settings = replace(node.settings, interval=0)
    node.measurer = node.make_measurer()
    node.now += 10**9
    assert node.measurer.due() == []


@pytest.mark.parametrize(
    ("change", "vendors", "why"),
    [
        pytest.param(
            {"health_state": HealthState.UNHEALTHY}, [Vendor.NVIDIA], "device is unhealthy",
            id="unhealthy",
        ),
        pytest.param(
            {}, [], "no nvidia discovery backend runs (a simulated device)", id="simulated"
        ),
        pytest.param(
            {"vendor": Vendor.CAMBRICON}, [Vendor.CAMBRICON],
            "no GEMM measurement for cambricon devices yet", id="no-measurement",
        ),
    ],
)  # fmt: skip
async def test_devices_it_does_not_measure(
    node: Node, change: dict[str, object], vendors: list[Vendor], why: str
) -> None:
    device = node.service.device(UUIDS[0])
    assert device is not None
    node.service.set_device(replace(device, **change))  # type: ignore[arg-type]
    node.measurer.vendors = frozenset(vendors)
    (outcome,) = await node.measurer.measure([UUIDS[0]])
    assert (outcome.status, outcome.message) == ("skipped", why)


async def test_figures_on_file_are_applied_at_start(node: Node) -> None:
    await node.measurer.measure([UUIDS[0]])
    measured = node.service.device(UUIDS[0])
    # hcsd restarts: the inventory has the profile figure again; the file brings the measured one
    node.service.set_device(nvidia(0))
    restarted = node.make_measurer()
    restarted.restore()
    assert node.service.device(UUIDS[0]) == measured
    # a device rediscovered after hot-plug gets it too; one never measured stays as it is
    assert restarted.refine(nvidia(0)) == measured
    assert restarted.refine(nvidia(1)) == nvidia(1)
    # and measuring again replaces the figure and its attributes rather than adding to them
    await restarted.measure([UUIDS[0]])
    again = node.service.device(UUIDS[0])
    assert again is not None
    keys = [k for k, _ in again.attributes]
    assert sorted(keys) == sorted(set(keys))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda p: p.write_bytes(b'{"GPU-x": {"tflops_fp16": 3\xff}}'), id="non-utf8"),
        pytest.param(lambda p: p.write_bytes(b'{"GPU-x": {"tflops_fp16": NaN}}'), id="nan"),
        pytest.param(lambda p: p.mkdir(), id="directory"),
    ],
)
def test_a_bad_file_never_stops_the_start(
    node: Node, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], object]
) -> None:
    node.path.parent.mkdir(parents=True, exist_ok=True)
    damage(node.path)
    with caplog.at_level(logging.ERROR):
        node.measurer.restore()  # hcsd's start: must not raise (systemd would restart it)
    assert node.service.device(UUIDS[0]) == nvidia(0)
    assert any("devices keep their profile figures" in m for m in caplog.messages)


async def test_a_healthy_card_is_rated_at_its_profile_and_each_ratio_is_against_it(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A card measuring above its model's typical share of the datasheet (0.7) is rated at the
    profile, never above; a later, slower measurement is compared with the profile again, not
    with the figure the device was rated at."""
    node.settings = replace(node.settings, size=8192)  # 4.4 ms per GEMM at 250 TFLOPS
    node.measurer = node.make_measurer()
    monkeypatch.setenv("FAKE_CUBLAS_TFLOPS", "250")  # 0.8 of the A100's 312
    await node.measurer.measure([UUIDS[0]])
    healthy = node.service.device(UUIDS[0])
    assert healthy is not None
    ratio = measured_ratio(healthy)
    assert ratio is not None and 0.7 < ratio <= 0.81
    assert (healthy.tflops_fp16, healthy.tflops_bf16) == (312.0, 312.0)
    monkeypatch.setenv("FAKE_CUBLAS_TFLOPS", "100")
    await node.measurer.measure([UUIDS[0]])
    slow = node.service.device(UUIDS[0])
    assert slow is not None
    raw = float(dict(slow.attributes)["measured_tflops_fp16"])
    assert 60 <= raw <= 101 and measured_ratio(slow) == pytest.approx(raw / 312, abs=1e-3)
    assert slow.tflops_fp16 == pytest.approx(raw / 0.7, abs=1e-2)
    assert node.on_file()[UUIDS[0]]["profile_tflops_fp16"] == 312


async def test_a_device_used_outside_hcs_is_skipped_and_a_figure_taken_meanwhile_discarded(
    node: Node,
) -> None:
    """Idle in the ledger is not idle on the device: the driver's process list decides too."""
    listed: dict[str, list[set[int] | None]] = {UUIDS[0]: [{4242}], UUIDS[1]: [set(), {777}]}
    node.measurer.occupants = lambda uuid: listed[uuid].pop(0)
    first, second = await node.measurer.measure()
    assert (first.status, first.message) == (
        "skipped",
        "process(es) 4242 outside HCS use the device",
    )
    assert second.status == "aborted"
    assert (
        second.message
        == "discarded: process(es) 777 outside HCS use the device while it was measured"
    )
    assert node.on_file() == {} and node.service.device(UUIDS[1]) == nvidia(1)


async def test_a_failed_try_is_retried_with_back_off_not_after_a_day(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    node.settings = replace(node.settings, interval=86400, idle_for=1)
    node.measurer = node.make_measurer()
    monkeypatch.setenv("FAKE_CUBLAS_STATUS", "13")
    (failed,) = await node.measurer.measure([UUIDS[0]])
    assert failed.status == "failed"
    assert UUIDS[0] not in node.measurer.due()
    node.now += 600  # RETRY_AFTER
    assert UUIDS[0] in node.measurer.due()
    await node.measurer.measure([UUIDS[0]])  # fails again: the wait doubles
    node.now += 600
    assert UUIDS[0] not in node.measurer.due()
    node.now += 600
    assert UUIDS[0] in node.measurer.due()
    monkeypatch.delenv("FAKE_CUBLAS_STATUS")
    (measured,) = await node.measurer.measure([UUIDS[0]])
    assert measured.status == "measured"
    node.now += 3600
    assert UUIDS[0] not in node.measurer.due()  # measured: the interval again


async def test_the_start_pass_keeps_a_figure_younger_than_the_interval(node: Node) -> None:
    node.settings = replace(node.settings, interval=86400)
    await node.measurer.measure([UUIDS[0]])  # at t=1000
    node.now += 3600  # hcsd restarts an hour later
    restarted = node.make_measurer()
    restarted.restore()
    outcomes = await restarted.start_pass()
    assert [(o.uuid, o.status) for o in outcomes] == [(UUIDS[1], "measured")]


def test_a_timeout_shorter_than_the_run_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^timeout: 3s leaves no time for warmup \+ duration"):
        MeasureSection(duration=3.0, warmup=0.5, timeout=3.0)
