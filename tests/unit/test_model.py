from __future__ import annotations

import pytest

from hcsd.model import HealthState, Link, LinkKind, Request, Vendor


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"container_id": ""}, "container id must not be empty", id="empty-id"),
        pytest.param({"container_id": "x" * 257}, "too long", id="long-id"),
        pytest.param({"container_id": "c", "devices": 0}, "at least 1", id="zero-devices"),
        pytest.param({"container_id": "c", "devices": 65}, "at most 64", id="many-devices"),
        pytest.param({"container_id": "c", "vram_bytes": 0}, "vram must be positive", id="vram0"),
        pytest.param({"container_id": "c", "tflops_fp16": 0.0}, "tflops", id="tflops0"),
        pytest.param({"container_id": "c", "compute_percent": 101}, "0..100", id="compute"),
    ],
)
def test_request_refuses_bad_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Request(**kwargs)  # type: ignore[arg-type]


def test_vendor_parse_is_case_insensitive_and_names_choices() -> None:
    assert Vendor.parse(" NVIDIA ") is Vendor.NVIDIA
    with pytest.raises(ValueError, match="expected one of nvidia, ascend, hygon, cambricon"):
        Vendor.parse("intel")


def test_health_schedulable() -> None:
    assert HealthState.DEGRADED.schedulable
    assert not HealthState.UNHEALTHY.schedulable
    assert not HealthState.LOST.schedulable


def test_link_p2p() -> None:
    assert Link("x", LinkKind.NVLINK, 300).p2p
    assert not Link("x", LinkKind.SYSTEM, 10).p2p
