"""Where a measured figure shows: the device in the API, `hcsctl devices` and `hcsctl
measure`, the ComputeNode (and so the extender's view of the node), the metrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest

from hcsd.api.messages import device_to_pb
from hcsd.api.server import ApiServer
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.api.v1 import hcsd_pb2_grpc as pb_grpc
from hcsd.benchmarks import Measurement, apply_measurement
from hcsd.cli import hcsctl, tables
from hcsd.cluster.objects import compute_node, node_spec, node_view
from hcsd.daemon.metrics import registry
from hcsd.service import DeviceStatus
from tests.benchmarks.conftest import UUIDS, FakeBlas, nvidia
from tests.benchmarks.test_measuring import Node

MEASURED = Measurement(UUIDS[0], 296.4, 312.0, 1650.0, 1.0, 48, 8192, "libcublas.so.12", 1.7e9)


def pb_devices() -> list[pb.Device]:
    measured = apply_measurement(nvidia(0), MEASURED)
    return [device_to_pb(DeviceStatus(d, 0, 0, 0)) for d in (measured, nvidia(1))]


def test_the_compute_node_carries_it_and_the_extender_reads_it() -> None:
    spec = node_spec(pb.Node(name="n1", version="1"), pb_devices())
    first, second = spec["devices"]
    assert (first["tflopsFP16"], first["fingerprint"]) == (296.4, "measured")
    assert first["measured"] == {
        "tflopsFP16": 296.4,
        "ratio": 0.95,
        "memoryBandwidthGBps": 1650.0,
        "at": "2023-11-14T22:13:20Z",
    }
    assert (second["tflopsFP16"], second["fingerprint"]) == (312.0, "profile")
    assert "measured" not in second
    view = node_view(compute_node("n1", spec))
    # the measured figure is what the extender converts TFLOPS requests with
    assert [d.tflops_fp16 for d in view.devices] == [296.4, 312.0]


@pytest.mark.parametrize(
    ("figures", "published"),
    [
        ((296.4, 0.95, 1650.0),
         {"tflopsFP16": 296.4, "ratio": 0.95, "memoryBandwidthGBps": 1650.0}),
        # a refused FP16 figure takes the ratio derived from it along (hcsd/cluster/measured.py)
        ((12000.0, 0.95, 1650.0), {"memoryBandwidthGBps": 1650.0}),
        ((296.4, 11.0, 1650.0), {"tflopsFP16": 296.4, "memoryBandwidthGBps": 1650.0}),
        ((296.4, 0.95, 1e6), {"tflopsFP16": 296.4, "ratio": 0.95}),
        ((float("nan"), -0.5, float("inf")), {}),
    ],
    ids=["in bounds", "tflops too high", "ratio too high", "bandwidth too high",
         "nan, negative, inf"],
)  # fmt: skip
def test_a_figure_outside_the_crds_bounds_is_left_out(
    figures: tuple[float, float, float], published: dict[str, float]
) -> None:
    """The API server would refuse the node's whole spec for one figure past the CRD's
    bounds (tests/cluster/test_crd_bounds.py): the syncer leaves that figure out."""
    tflops, ratio, bandwidth = figures
    attributes = {"fingerprint": "measured", "measured_tflops_fp16": str(tflops),
                  "measured_ratio": str(ratio), "measured_bandwidth_gbps": str(bandwidth),
                  "measured_at": "2023-11-14T22:13:20Z"}  # fmt: skip
    device = pb.Device(uuid="GPU-bounds", vendor="nvidia", model="A100", attributes=attributes)
    (found,) = node_spec(pb.Node(name="n1", version="1"), [device])["devices"]
    assert found["measured"] == {**published, "at": "2023-11-14T22:13:20Z"}


def test_hcsctl_devices_shows_it() -> None:
    lines = tables.devices_table(pb_devices()).splitlines()
    column = lines[0].index("MEASURED")
    assert [line[column:].split()[0] for line in lines[1:]] == ["95%", "-"]


def test_the_metrics_export_it(tmp_path: Path, fake_blas: FakeBlas) -> None:
    node = Node(tmp_path, fake_blas)
    node.service.set_device(apply_measurement(nvidia(0), MEASURED))
    text = generate_latest(registry(node.service)).decode()
    labels = f'device="{UUIDS[0]}",index="0",model="A100-SXM4-80GB",vendor="nvidia"'
    assert f"hcs_device_measured_fp16_tflops{{{labels}}} 296.4" in text
    (stamp,) = [
        ln for ln in text.splitlines() if ln.startswith("hcs_device_measured_timestamp_seconds{")
    ]
    assert stamp.startswith(f"hcs_device_measured_timestamp_seconds{{{labels}}} ")
    assert float(stamp.split()[-1]) == MEASURED.at
    assert f"hcs_device_measured_ratio{{{labels}}} 0.95" in text
    assert f"hcs_device_measured_memory_bandwidth_bytes_per_second{{{labels}}} 1.65e+12" in text
    (acu,) = [
        ln
        for ln in text.splitlines()
        if ln.startswith("hcs_device_acu{") and 'source="measured"' in ln
    ]
    assert UUIDS[0] in acu and float(acu.split()[-1]) == pytest.approx(95.0)
    assert UUIDS[1] not in "".join(ln for ln in text.splitlines() if "measured_ratio" in ln)
    node.ledger.close()


@pytest.fixture
async def served(tmp_path: Path, fake_blas: FakeBlas) -> AsyncIterator[tuple[Node, str]]:
    node = Node(tmp_path, fake_blas)
    socket = str(tmp_path / "run" / "hcsd.sock")
    server = ApiServer(node.service, socket, measure=node.measurer.measure)
    await server.start()
    yield node, socket
    await server.stop(0.5)
    node.ledger.close()


async def test_measure_over_the_api(served: tuple[Node, str]) -> None:
    node, socket = served
    node.hold(1)
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        response = await pb_grpc.HcsdStub(channel).Measure(pb.MeasureRequest())
    first, second = response.results
    assert (first.uuid, first.outcome) == (UUIDS[0], "measured")
    assert 24 <= first.tflops_fp16 <= 40.4
    assert first.ratio == pytest.approx(first.tflops_fp16 / 312)
    assert first.memory_bandwidth_gbps > 0 and first.seconds > 0
    assert (second.outcome, second.message) == (
        "skipped",
        "team-a/trainer/main was allocated the device",
    )


async def test_hcsctl_measure(served: tuple[Node, str], capsys: pytest.CaptureFixture[str]) -> None:
    _, socket = served
    code = await asyncio.to_thread(hcsctl.main, ["--socket", socket, "measure", UUIDS[1]])
    assert code == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:5] == ["DEVICE", "UUID", "OUTCOME", "FP16", "TFLOPS"]
    assert row.split()[:3] == ["nvidia/1", UUIDS[1], "measured"]
    # a device this node does not have is a mistake in the command: exit 1, and why
    code = await asyncio.to_thread(hcsctl.main, ["--socket", socket, "measure", "nope"])
    assert code == 1
    out = capsys.readouterr().out
    assert "failed" in out and "no such device on this node" in out
    # a UUID named twice is measured once
    code = await asyncio.to_thread(hcsctl.main, ["--socket", socket, "measure", UUIDS[1], UUIDS[1]])
    assert code == 0 and len(capsys.readouterr().out.splitlines()) == 2


async def test_hcsctl_measure_exits_1_when_a_measurement_fails(
    served: tuple[Node, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, socket = served
    monkeypatch.setenv("FAKE_CUBLAS_STATUS", "13")
    code = await asyncio.to_thread(hcsctl.main, ["--socket", socket, "measure", UUIDS[0]])
    assert code == 1
    out = capsys.readouterr().out
    assert "failed" in out and "CUBLAS_STATUS_EXECUTION_FAILED (13)" in out


async def test_measure_without_a_measurer(tmp_path: Path, fake_blas: FakeBlas) -> None:
    node = Node(tmp_path, fake_blas)
    socket = str(tmp_path / "run" / "hcsd.sock")
    server = ApiServer(node.service, socket)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await pb_grpc.HcsdStub(channel).Measure(pb.MeasureRequest())
        assert raised.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    finally:
        await server.stop(0.5)
        node.ledger.close()
