"""bench/dra_bench.py's pure parts: what it computes from its clock readings, and that its DRA
pods and slices have the shapes the webhook and the syncer write."""

from __future__ import annotations

from typing import Any

import pytest

from bench.dra_bench import DEVICES_PER_NODE, gpu_devices, pod_body, summarize
from hcsd.cluster.dra_slices import slice_spec
from hcsd.cluster.webhook_dra import dra_patch
from hcsd.contract.dra import DRIVER, POD_CLAIM_NAME


def test_throughput_spans_first_post_to_last_bind_and_latency_is_per_pod() -> None:
    # 100 pods posted 10 ms apart from t=50, each bound (i + 1) * 20 ms after its post.
    created = {f"p{i}": 50.0 + i * 0.01 for i in range(100)}
    bound = {name: t + (i + 1) * 0.02 for i, (name, t) in enumerate(created.items())}
    found = summarize(created, bound)
    last = 50.0 + 99 * 0.01 + 100 * 0.02  # 2.99 s after the first post
    assert found["bound"] == 100 and found["seconds"] == pytest.approx(last - 50.0, abs=0.01)
    assert found["pods_per_s"] == pytest.approx(100 / 2.99, abs=0.1)
    assert found["p50_ms"] == pytest.approx(1000.0, abs=20.5)  # the 50th/51st of 20..2000 ms
    assert found["p99_ms"] == pytest.approx(1980.0, abs=0.5)
    assert found["max_ms"] == pytest.approx(2000.0, abs=0.5)


def test_unbound_pods_count_in_the_batch_but_not_in_the_figures() -> None:
    created = {"a": 0.0, "b": 0.0, "late": 0.0}
    found = summarize(created, {"a": 1.0, "b": 3.0, "other-batch": 9.0})
    assert found["pods"] == 3 and found["bound"] == 2
    assert found["seconds"] == 3.0 and found["pods_per_s"] == pytest.approx(0.7, abs=0.05)
    assert summarize(created, {}) == {"pods": 3, "bound": 0}


def test_dra_pod_is_the_webhooks_patch_applied() -> None:
    made: list[tuple[str, str, dict[str, Any]]] = []
    patch = dra_patch(
        pod_body("x", "dra", []), "ns", lambda ns, name, spec: made.append((ns, name, spec))
    ).patch
    pod = pod_body("p0001", "dra", patch)
    ((_, template, spec),) = made
    assert pod["spec"]["resourceClaims"] == [
        {"name": POD_CLAIM_NAME, "resourceClaimTemplateName": template}
    ]
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["claims"] == [{"name": POD_CLAIM_NAME, "request": "r0"}]
    assert not container["resources"].get("limits")  # no ai.compute/* left for a node to offer
    (request,) = spec["devices"]["requests"]
    assert request["exactly"]["capacity"]["requests"]["memory"] == "16Gi"
    assert pod_body("p0001", "extender", [])["spec"]["containers"][0]["resources"] == {
        "limits": {"ai.compute/vram": "16Gi"}
    }


def test_a_fake_gpu_node_publishes_eight_shareable_a100s_on_one_nvlink_island() -> None:
    devices = slice_spec("node-0007", gpu_devices("node-0007"), generation=1)["devices"]
    assert len(devices) == DEVICES_PER_NODE == 8
    domains = {d["attributes"]["linkDomain"]["string"] for d in devices}
    assert domains == {"nvidia-nvlink-0"}
    assert all(d["allowMultipleAllocations"] for d in devices)
    assert {d["attributes"]["model"]["string"] for d in devices} == {"A100-SXM4-80GB"}
    assert DRIVER == "compute.hcs.io"
