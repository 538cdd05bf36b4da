"""The injector on its own: where a request comes from, what stays in the ledger, refusals.

No runtime and no transport: `Injector.create` with a container's identity and annotations,
against a real ledger and the simulated mixed node (the front ends have their own tests).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from hcsd.contract.assignment import sign
from hcsd.discovery import Inventory
from hcsd.ledger import Ledger
from hcsd.model import Allocation, FrontEnd, Grant, HealthState, PodRef, Request
from hcsd.refusals import Reason, Refusal
from hcsd.runtime.injector import ContainerInfo, Injector
from hcsd.runtime.presence import ContainerView, RunningContainer
from hcsd.service import NodeService
from tests.conftest import GiB
from tests.harness.local import DiskFull, local_node

KEY = b"test-cluster-key-0123456789abcdef"
A100_0 = "GPU-5b2f0c0e-8d1a-4c11-9d2e-a100a100a000"
NOW = 1_760_000_000.0
POD = PodRef("team-a", "trainer", "pod-uid-1")


@dataclass
class Setup:
    injector: Injector
    service: NodeService
    ledger: Ledger
    fs: DiskFull
    run_dir: Path
    keys: list[bytes]


@pytest.fixture
def setup(tmp_path: Path, mixed_inventory: Inventory) -> Setup:
    node = local_node(tmp_path, mixed_inventory, clock=lambda: NOW)
    keys = [KEY]
    injector = node.injector(keyring=lambda: {"": keys[-1]}, clock=lambda: NOW)
    return Setup(injector, node.service, node.ledger, node.disk, node.run_dir, keys)


def info(
    cid: str = "c1",
    annotations: dict[str, str] | None = None,
    pod_annotations: dict[str, str] | None = None,
    *,
    name: str = "main",
) -> ContainerInfo:
    return ContainerInfo(cid, name, POD, annotations or {}, pod_annotations or {})


def assignment(key: bytes = KEY, **overrides: object) -> dict[str, str]:
    body: dict[str, object] = {
        "v": 1,
        "node": "sim",
        "pod_uid": POD.uid,
        "issued": NOW - 60,
        "containers": {"main": [{"uuid": A100_0, "vram": 16 * GiB, "compute": 25}]},
    }
    body.update(overrides)
    return {"hcs.io/assignment": sign(body, key)}


def test_a_container_that_asks_for_nothing_is_left_alone(setup: Setup) -> None:
    assert setup.injector.create(info(annotations={"other.io/x": "1"})) is None
    assert setup.service.allocations() == [] and not setup.run_dir.exists()


def test_local_annotations_allocate_before_the_edits_are_returned(setup: Setup) -> None:
    edits = setup.injector.create(
        info(annotations={"hcs.io/vram": "8Gi", "hcs.io/vendors": "nvidia"})
    )
    assert edits is not None
    held = setup.service.allocation("c1")
    assert held is not None and held.source == "local" and held.pod == POD
    assert held.grants == (Grant(A100_0, 8 * GiB),) and setup.service.seq == 1
    assert {n.path for n in edits.devices} >= {"/dev/nvidia0", "/dev/nvidiactl"}
    assert dict(edits.env)["HCS_CONFIG"] == "/run/hcs/quota.conf"
    quota = (setup.run_dir / "containers" / "c1" / "quota.conf").read_text()
    assert f"device.0.vram_limit={8 * GiB}" in quota


@pytest.mark.parametrize(
    ("annotations", "pod_annotations", "vram"),
    [
        pytest.param({"hcs.io/vram": "8Gi"}, {"hcs.io/vram": "2Gi"}, 8, id="container-wins"),
        pytest.param({}, {"hcs.io/vram": "2Gi"}, 2, id="pod-default"),
        pytest.param(
            {"hcs.io/vram": "4Gi"}, assignment(), 16, id="assignment-wins-over-annotations"
        ),
    ],
)
def test_precedence(
    setup: Setup, annotations: dict[str, str], pod_annotations: dict[str, str], vram: int
) -> None:
    setup.injector.create(info(annotations=annotations, pod_annotations=pod_annotations))
    held = setup.service.allocation("c1")
    assert held is not None and held.grants[0].vram_bytes == vram * GiB


def test_a_signed_assignment_is_held_as_decided(setup: Setup) -> None:
    setup.injector.create(info(pod_annotations=assignment()))
    held = setup.service.allocation("c1")
    assert held is not None and held.source == "assignment" and held.created == NOW
    assert held.grants == (Grant(A100_0, 16 * GiB, 25),)


def test_a_container_the_assignment_gives_nothing_gets_nothing(setup: Setup) -> None:
    assert setup.injector.create(info(pod_annotations=assignment(), name="sidecar")) is None
    assert setup.service.allocations() == []


def test_the_key_is_read_per_assignment(setup: Setup) -> None:
    """hcs-syncer installs or rotates the key while hcsd runs: no restart needed."""
    setup.keys.append(b"rotated-key-0123456789abcdef-0123")
    with pytest.raises(Refusal, match="signature does not verify"):
        setup.injector.create(info(pod_annotations=assignment(KEY)))
    setup.injector.create(info(pod_annotations=assignment(b"rotated-key-0123456789abcdef-0123")))
    assert setup.service.allocation("c1") is not None


@pytest.mark.parametrize(
    ("annotations", "pod_annotations", "reason", "text"),
    [
        pytest.param(
            {}, assignment(issued=NOW - 30 * 86400), Reason.BAD_ASSIGNMENT, "stale", id="stale"
        ),
        pytest.param({}, assignment(node="node-9"), Reason.BAD_ASSIGNMENT, "node-9", id="node"),
        pytest.param(
            {"hcs.io/devices": "two"}, {}, Reason.INVALID_REQUEST, "whole number", id="devices"
        ),
        pytest.param(
            {"hcs.io/vram": "1Ti"}, {}, Reason.INSUFFICIENT_VRAM, "1Ti wanted", id="too-big"
        ),
        pytest.param(
            {"hcs.io/vram": "1Gi", "hcs.io/models": "A100\nhcsd: allocated 80Gi to team-b"},
            {},
            Reason.INVALID_REQUEST,
            "is not a model name",
            id="model-with-a-newline",
        ),
    ],
)
def test_refusals_name_the_container_count_once_and_keep_nothing(
    setup: Setup,
    annotations: dict[str, str],
    pod_annotations: dict[str, str],
    reason: Reason,
    text: str,
) -> None:
    with pytest.raises(Refusal) as refused:
        setup.injector.create(info(annotations=annotations, pod_annotations=pod_annotations))
    assert refused.value.reason is reason and text in str(refused.value)
    assert str(refused.value).startswith("team-a/trainer/main: ")
    assert setup.service.refusal_counts() == {reason: 1}
    assert setup.service.allocations() == []


def test_an_assignment_onto_an_unhealthy_device_is_refused(setup: Setup) -> None:
    device = setup.service.device(A100_0)
    assert device is not None
    setup.service.set_device(replace(device, health_state=HealthState.UNHEALTHY))
    with pytest.raises(Refusal) as refused:
        setup.injector.create(info(pod_annotations=assignment()))
    assert refused.value.reason is Reason.UNHEALTHY and not refused.value.temporary


def test_a_full_disk_is_a_temporary_refusal(setup: Setup) -> None:
    setup.fs.full = True
    with pytest.raises(Refusal) as refused:
        setup.injector.create(info(annotations={"hcs.io/vram": "8Gi"}))
    assert refused.value.reason is Reason.WRITE_FAILED and refused.value.temporary
    assert setup.service.allocations() == []
    setup.fs.full = False
    assert setup.injector.create(info(annotations={"hcs.io/vram": "8Gi"})) is not None


def test_creating_again_is_harmless(setup: Setup) -> None:
    first = setup.injector.create(info(annotations={"hcs.io/vram": "8Gi"}))
    seq = setup.service.seq
    assert setup.injector.create(info(annotations={"hcs.io/vram": "8Gi"})) == first
    assert setup.service.seq == seq  # no second record


def test_missing_libhcs_refuses_and_releases(tmp_path: Path, mixed_inventory: Inventory) -> None:
    node = local_node(tmp_path, mixed_inventory)
    service, injector = node.service, node.injector(libhcs=tmp_path / "absent.so")
    with pytest.raises(Refusal, match=r"libhcs is not installed at .*absent\.so") as refused:
        injector.create(info("c9", {"hcs.io/vram": "1Gi"}))
    assert refused.value.reason is Reason.PREPARE_FAILED
    assert service.allocation("c9") is None and service.refusal_counts() == {
        Reason.PREPARE_FAILED: 1
    }
    node.close()


@pytest.mark.parametrize(
    "cid",
    [
        pytest.param("../escape", id="path"),
        pytest.param("c1\n", id="trailing-newline"),
        pytest.param("c1\nforged log line", id="newline"),
        pytest.param("a" * 129, id="too-long"),
    ],
)
def test_an_unsafe_container_id_is_refused_before_anything_is_recorded(
    setup: Setup, cid: str
) -> None:
    with pytest.raises(Refusal, match="is not 1-128 characters of letters") as refused:
        setup.injector.create(info(cid, {"hcs.io/vram": "1Gi"}))
    assert refused.value.reason is Reason.INVALID_REQUEST
    assert "\n" not in str(refused.value)  # the id is shown escaped
    assert setup.service.allocations() == [] and setup.service.seq == 0
    assert not setup.run_dir.exists()


def test_stop_releases_and_deletes_the_quota_directory_removal_finds_nothing(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    setup.injector.create(info(annotations={"hcs.io/vram": "8Gi"}))
    directory = setup.run_dir / "containers" / "c1"
    assert directory.is_dir()
    setup.injector.stopped("c1")
    assert setup.service.allocation("c1") is None and not directory.exists()
    with caplog.at_level("WARNING"):
        setup.injector.stopped("c1")  # again: harmless
        setup.injector.removed("c1")  # kubelet's later removal: nothing left to do
        setup.injector.removed("c1")
    assert not directory.exists() and caplog.records == []


def seen(cid: str, setup: Setup) -> RunningContainer:
    """A running container as NRI lists it, with hcsd's edits in place."""
    preload = str(setup.run_dir / "ld.so.preload")
    quota = str(setup.run_dir / "containers" / cid / "quota.conf")
    view = ContainerView.of(
        mounts=[("/etc/ld.so.preload", preload), ("/run/hcs/quota.conf", quota)]
    )
    return RunningContainer(replace(info(cid), front_end=FrontEnd.NRI), view)


def test_reconcile_releases_only_containers_that_are_gone(setup: Setup) -> None:
    for cid in ("alive", "gone"):
        nri = replace(info(cid, {"hcs.io/vram": "1Gi"}), front_end=FrontEnd.NRI)
        setup.injector.create(nri)
    setup.service.allocate(Request("operator", vram_bytes=GiB))  # made through the API
    stray = setup.run_dir / "containers" / "stray"
    stray.mkdir()
    released = setup.injector.reconcile([seen("alive", setup)], FrontEnd.NRI)
    assert released == ["gone"]
    assert sorted(a.container_id for a in setup.service.allocations()) == ["alive", "operator"]
    assert sorted(p.name for p in (setup.run_dir / "containers").iterdir()) == ["alive"]


def test_reconcile_keeps_the_directory_of_a_held_container(setup: Setup) -> None:
    """A quota directory whose container the runtime does not list but the ledger holds (an
    operator's API allocation) is not ours to delete."""
    setup.service.hold(Allocation("held", (Grant(A100_0, GiB),), source="api"))
    (setup.run_dir / "containers" / "held").mkdir(parents=True)
    setup.injector.reconcile([], FrontEnd.NRI)
    assert (setup.run_dir / "containers" / "held").is_dir()


def test_assignments_use_the_injector_clock(setup: Setup) -> None:
    # By the wall clock this assignment is long stale; the injector's clock decides.
    assert time.time() - NOW > 8 * 86400
    setup.injector.create(info(pod_annotations=assignment(issued=NOW - 500)))
    assert setup.service.allocation("c1") is not None
