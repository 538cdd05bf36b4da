"""The ComputeNode CRD's bounds on a node's measured figures, on a real kube-apiserver: a
figure past them is refused (422), whatever writes it; the syncer leaves such a figure out
(objects.MEASURED_BOUNDS, tests/benchmarks/test_showing.py) so its spec still goes through."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest

from hcsd.cluster.kube import KubeError
from hcsd.cluster.objects import MEASURED_BOUNDS
from tests.cluster.controlplane import ControlPlane

pytestmark = pytest.mark.slow

CN = "/apis/hcs.io/v1alpha1/computenodes"
GOOD = {"tflopsFP16": 296.4, "ratio": 0.95, "memoryBandwidthGBps": 1650.0}


def create(plane: ControlPlane, measured: dict[str, Any]) -> int:
    """A ComputeNode with one device measured so; the API server's status code."""
    name = f"bounds-{uuid.uuid4().hex[:6]}"
    device = {"uuid": "GPU-0", "vendor": "nvidia", "model": "A100-SXM4-80GB",
              "vramBytes": 2**30, "fingerprint": "measured",
              "measured": {**measured, "at": "2026-11-23T09:00:00Z"}}  # fmt: skip
    admin = plane.kube()
    try:
        admin.create(CN, {"apiVersion": "hcs.io/v1alpha1", "kind": "ComputeNode",
                          "metadata": {"name": name},
                          "spec": {"nodeName": name, "devices": [device]}})  # fmt: skip
        with contextlib.suppress(KubeError):
            admin.request("DELETE", f"{CN}/{name}")
        return 201
    except KubeError as e:
        return e.status
    finally:
        admin.close()


def test_figures_within_the_bounds_are_taken(plane: ControlPlane) -> None:
    assert create(plane, GOOD) == 201
    edges = {name: high for name, (_, high) in MEASURED_BOUNDS.items()}
    assert create(plane, edges) == 201
    assert create(plane, {name: low for name, (low, _) in MEASURED_BOUNDS.items()}) == 201


@pytest.mark.parametrize("field", sorted(MEASURED_BOUNDS))
@pytest.mark.parametrize("side", ["above the maximum", "below the minimum"])
def test_a_figure_past_a_bound_is_refused(plane: ControlPlane, field: str, side: str) -> None:
    low, high = MEASURED_BOUNDS[field]
    value = high * 1.5 if side == "above the maximum" else low - 1
    assert create(plane, {**GOOD, field: value}) == 422
