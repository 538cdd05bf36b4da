"""A measured FP16 figure the syncer refuses (outside MEASURED_BOUNDS) takes its rating, its
ratio and its `measured` fingerprint with it: the ComputeNode shows the profile's figures."""

from __future__ import annotations

import logging

import pytest

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster import measured as figures
from hcsd.cluster.objects import node_spec, node_status

NODE = pb.Node(name="n1", version="test", backends=["nvidia"])


def measured(fp16: str, *, model: str = "A100-SXM4-80GB", rated: float = 296.4) -> pb.Device:
    """A device as hcsd reports it after a measurement: rated from the measured figure."""
    return pb.Device(
        uuid=f"GPU-{model}",
        vendor="nvidia",
        model=model,
        vram_bytes=80 * 2**30,
        tflops_fp16=rated,
        tflops_bf16=rated,
        tflops_fp32=19.5,
        tops_int8=624.0,
        health_state=pb.HEALTH_STATE_HEALTHY,
        attributes={
            "fingerprint": "measured",
            "measured_tflops_fp16": fp16,
            "measured_ratio": "0.9500",
            "measured_bandwidth_gbps": "1650.0",
            "measured_at": "2026-01-01T00:00:00Z",
        },
    )


def shown(device: pb.Device) -> dict[str, object]:
    (found,) = node_spec(NODE, [device])["devices"]
    return dict(found)


def test_a_measured_figure_within_bounds_is_published_with_its_rating() -> None:
    found = shown(measured("231.000"))
    assert found["fingerprint"] == "measured" and found["tflopsFP16"] == 296.4
    assert found["measured"] == {"at": "2026-01-01T00:00:00Z", "tflopsFP16": 231.0,
                                 "ratio": 0.95, "memoryBandwidthGBps": 1650.0}  # fmt: skip


@pytest.mark.parametrize("fp16", ["-5.000", "20000.000", "nan", "fast"])
def test_a_refused_measured_figure_publishes_the_profiles_figures(fp16: str) -> None:
    found = shown(measured(fp16, rated=-4.7))
    assert found["fingerprint"] == "profile"
    assert (found["tflopsFP16"], found["tflopsBF16"]) == (312.0, 312.0)  # the A100's profile
    assert (found["tflopsFP32"], found["topsINT8"]) == (19.5, 624.0)
    assert found["measured"] == {"at": "2026-01-01T00:00:00Z", "memoryBandwidthGBps": 1650.0}
    status = node_status([measured(fp16, rated=-4.7)], [], previous={}, now="t")
    assert status["acuTotal"] == 100.0  # one A100 at its profile figure


def test_without_a_profile_a_refused_figure_leaves_the_device_unrated() -> None:
    found = shown(measured("1e9", model="NoSuchCard", rated=1e9))
    assert found["fingerprint"] == "profile" and found["tflopsFP16"] == 0.0
    assert "ratio" not in found["measured"]  # type: ignore[operator]


def test_a_refused_figure_is_warned_about_once_per_device_until_it_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    figures._refused.clear()
    with caplog.at_level(logging.WARNING, logger="hcsd.cluster.measured"):
        for text in ("-1", "-2", "-3"):
            shown(measured(text))
        assert len(figures._refused) == 1  # keyed by device and figure, not by text
        assert caplog.text.count("not published") == 1
        shown(measured("231.000"))
        assert not figures._refused
        shown(measured("-4"))
    assert caplog.text.count("not published") == 2
