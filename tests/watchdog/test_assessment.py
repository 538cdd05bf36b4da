"""The comparison of each container's real use with its grant, as a pure function."""

from __future__ import annotations

import pytest

from hcsd.model import Allocation
from hcsd.watchdog.assessment import Attributed, Tolerance, assess
from hcsd.watchdog.usage import ProcessUsage
from tests.watchdog.conftest import UUIDS, GiB, allocation

MiB = 2**20
A, B, C = "a" * 64, "b" * 64, "c" * 64
G0, G1 = UUIDS[0], UUIDS[1]
TOLERANCE = Tolerance(percent=5.0, per_process_bytes=512 * MiB)


def run(
    processes: list[tuple[str, int, int, tuple[str, ...] | None]],
    allocations: list[Allocation],
    *,
    per_process: frozenset[str] = frozenset({G0, G1}),
    totals: dict[str, int] | None = None,
    accounted: dict[str, dict[str, int]] | None = None,
):  # type: ignore[no-untyped-def]
    return assess(
        [Attributed(ProcessUsage(d, pid, used), ids) for d, pid, used, ids in processes],
        allocations,
        totals=totals or {},
        per_process=per_process,
        tolerance=TOLERANCE,
        accounted=(lambda a: (accounted or {}).get(a.container_id)),
    )


@pytest.mark.parametrize(
    ("used", "processes", "over"),
    [
        pytest.param(8 * GiB, 1, False, id="at-the-grant"),
        # 8Gi + 5% (409.6Mi) + 512Mi per process = 8.9Gi allowed for one process
        pytest.param(8 * GiB + 921 * MiB, 1, False, id="inside-the-tolerance"),
        pytest.param(8 * GiB + 922 * MiB, 1, True, id="just-past-it"),
        pytest.param(8 * GiB + 1400 * MiB, 2, False, id="two-contexts-are-allowed-two-shares"),
        pytest.param(20 * GiB, 4, True, id="far-past"),
    ],
)
def test_tolerance_is_a_share_of_the_grant_and_a_context_per_process(
    used: int, processes: int, over: bool
) -> None:
    share = used // processes
    listed = [(G0, 100 + i, share, (A,)) for i in range(processes)]
    listed[0] = (G0, 100, used - share * (processes - 1), (A,))
    result = run(listed, [allocation(A, {0: 8 * GiB})])
    (usage,) = result.containers
    assert usage.used_bytes == used and usage.granted_bytes == 8 * GiB
    assert usage.over is over
    assert [v.allocation.container_id for v in result.violations] == ([A] if over else [])


def test_processes_are_summed_per_container_and_device() -> None:
    result = run(
        [
            (G0, 1, 3 * GiB, (A,)),
            (G0, 2, 4 * GiB, (A,)),
            (G1, 3, 1 * GiB, (A,)),  # a device it was not granted: allowed only a context
            (G0, 4, 2 * GiB, (B,)),
        ],
        [allocation(A, {0: 8 * GiB}), allocation(B, {0: 4 * GiB})],
        accounted={A: {G0: 7 * GiB}},
    )
    by_key = {(u.allocation.container_id, u.device_uuid): u for u in result.containers}
    assert by_key[(A, G0)].used_bytes == 7 * GiB and by_key[(A, G0)].pids == (1, 2)
    assert by_key[(A, G0)].accounted_bytes == 7 * GiB and not by_key[(A, G0)].over
    assert by_key[(A, G1)].granted_bytes == 0 and by_key[(A, G1)].over
    assert by_key[(B, G0)].accounted_bytes is None and not by_key[(B, G0)].over


def test_strays_are_processes_of_no_container_with_a_grant() -> None:
    result = run(
        [
            (G0, 1, GiB, ()),  # a host process
            (G0, 2, GiB, (C,)),  # a container hcsd never granted anything
            (G0, 3, GiB, None),  # exited between the listing and the cgroup read
            (G0, 4, GiB, (A, B)),  # charged to A, which encloses it
        ],
        [allocation(A, {0: 8 * GiB}), allocation(B, {0: 8 * GiB})],
    )
    assert [(s.pid, s.container_id) for s in result.strays] == [(1, ""), (2, C)]
    assert {(u.allocation.container_id, u.used_bytes) for u in result.containers} == {
        (A, GiB),
        (B, 0),
    }


def test_a_device_without_process_figures_is_judged_on_its_total() -> None:
    result = run(
        [(G1, 1, 30 * GiB, (A,))],  # listed, but G1's vendor gives no per-process figures
        [allocation(A, {1: 8 * GiB}), allocation(B, {0: 8 * GiB, 1: 8 * GiB})],
        per_process=frozenset({G0}),
        totals={G0: 2 * GiB, G1: 30 * GiB},
    )
    assert {u.device_uuid for u in result.containers} == {G0}  # no one blamed on G1
    devices = {d.device_uuid: d for d in result.devices}
    assert devices[G1].granted_bytes == 16 * GiB and not devices[G1].per_process
    # 16Gi + 5% + 512Mi for each of two holders and the driver's own
    assert devices[G1].allowed_bytes == 16 * GiB + int(16 * GiB * 0.05) + 3 * 512 * MiB
    assert devices[G1].over and not devices[G0].over


def test_the_containers_of_a_claim_are_charged_together_to_the_claim() -> None:
    claim = "claim-4d1e0c9a-7b2f-4e51-8a3c-1f6b9d2e7c05"
    processes = [(G0, 100, 3 * GiB, (A,)), (G0, 101, 3 * GiB, (B,)), (G0, 102, 1 * GiB, (C,))]
    held = [allocation(claim, {0: 4 * GiB}), allocation(C, {0: 2 * GiB})]
    result = assess(
        [Attributed(ProcessUsage(d, pid, used), ids) for d, pid, used, ids in processes],
        held,
        totals={},
        per_process={G0},
        tolerance=TOLERANCE,
        members={A: claim, B: claim, C: claim},  # C holds its own grant: that comes first
    )
    by_holder = {u.allocation.container_id: u for u in result.containers}
    assert (by_holder[claim].used_bytes, by_holder[claim].pids) == (6 * GiB, (100, 101))
    assert by_holder[claim].over and not by_holder[C].over
    assert result.strays == []
