"""A pod's `ai.compute/*` request as a ResourceClaim spec (hcsd/cluster/claim_shapes.py).

Tables of pods (read by the extender's own demand_of) against the claim spec expected, then
the properties of the exchange-rate alternatives: at most 8, best first, named models before
substitutes and substitutes only with consent, never less compute than a model needs.
"""

from __future__ import annotations

from typing import Any

import pytest

from hcsd.cluster.claim_shapes import (
    MAX_ALTERNATIVES,
    ShapeError,
    alternatives_for,
    claim_spec,
    group,
    template_name,
)
from hcsd.cluster.demand import Demand, demand_of
from hcsd.profiles.database import default_database
from hcsd.profiles.exchange import share_percent

DB = default_database()
CEL = 'cel.bind(a, device.attributes["compute.hcs.io"], {})'


def demand(limits: dict[str, str], **annotations: str) -> Demand:
    pod = {
        "metadata": {"namespace": "team", "annotations": {f"hcs.io/{k.replace('_', '-')}": v
                                                          for k, v in annotations.items()}},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }  # fmt: skip
    found = demand_of(pod)
    assert found is not None
    return found


def exactly(cls: str, count: int, requests: dict[str, str], selector: str = "") -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": count}
    if selector:
        body["selectors"] = [{"cel": {"expression": CEL.format(selector)}}]
    body["capacity"] = {"requests": requests}
    return body


MODEL_A100 = 'has(a.model) && a.model.lowerAscii() in ["a100", "a100-sxm4-80gb"]'
ONLY_A100 = 'has(a.model) && a.model.lowerAscii() in ["a100-sxm4-80gb"]'
UUID = {"distinctAttribute": "compute.hcs.io/uuid"}
LINK = {"matchAttribute": "compute.hcs.io/linkDomain"}

CASES = {
    "16Gi: a slice of any device, no compute reserved": (
        demand({"ai.compute/vram": "16Gi"}),
        {"requests": [{"name": "r0", "exactly": exactly(
            "ai.compute", 1, {"compute": "0", "memory": "16Gi"})}]},
    ),
    "1000Mi: rounded up to the slices' 256Mi step": (
        demand({"ai.compute/vram": "1000Mi"}),
        {"requests": [{"name": "r0", "exactly": exactly(
            "ai.compute", 1, {"compute": "0", "memory": "1Gi"})}]},
    ),
    "2 whole devices: distinct devices, any link": (
        demand({"ai.compute/devices": "2"}),
        {"requests": [{"name": "r0", "exactly": exactly("ai.compute", 2, {"compute": "100"})}],
         "constraints": [{"requests": ["r0"], **UUID}]},
    ),
    "2 whole devices, high-bandwidth: one link domain": (
        demand({"ai.compute/devices": "2"}, topology_preference="high-bandwidth"),
        {"requests": [{"name": "r0", "exactly": exactly("ai.compute", 2, {"compute": "100"})}],
         "constraints": [{"requests": ["r0"], **UUID}, {"requests": ["r0"], **LINK}]},
    ),
    "one vendor: its class": (
        demand({"ai.compute/vram": "8Gi"}, vendors="nvidia"),
        {"requests": [{"name": "r0", "exactly": exactly(
            "nvidia.compute.hcs.io", 1, {"compute": "0", "memory": "8Gi"})}]},
    ),
    "two vendors: the any class and a vendor selector": (
        demand({"ai.compute/vram": "8Gi"}, vendors="nvidia,ascend"),
        {"requests": [{"name": "r0", "exactly": exactly(
            "ai.compute", 1, {"compute": "0", "memory": "8Gi"},
            'has(a.vendor) && a.vendor in ["ascend", "nvidia"]')}]},
    ),
    "a model by alias: its name and the profile's": (
        demand({"ai.compute/vram": "8Gi"}, models="A100"),
        {"requests": [{"name": "r0", "exactly": exactly(
            "ai.compute", 1, {"compute": "0", "memory": "8Gi"}, MODEL_A100)}]},
    ),
    "100 TFLOPS of an A100: one device, 33% of it": (
        demand({"ai.compute/vram": "16Gi", "ai.compute/tflops-fp16": "100"}, models="A100"),
        {"requests": [{"name": "r0", "exactly": exactly(
            "nvidia.compute.hcs.io", 1, {"compute": "33", "memory": "16Gi"},
            ONLY_A100)}]},
    ),
    "100 TFLOPS without VRAM: whole devices": (
        demand({"ai.compute/tflops-fp16": "100"}, models="MLU370-X8"),
        {"requests": [{"name": "r0", "exactly": exactly(
            "cambricon.compute.hcs.io", 2, {"compute": "100"},
            'has(a.model) && a.model.lowerAscii() in ["mlu370-x8"]')}],
         "constraints": [{"requests": ["r0"], **UUID}]},
    ),
    "100 TFLOPS on A100, 910B3 or MLU370: the issue's list, in its order": (
        demand({"ai.compute/vram": "16Gi", "ai.compute/tflops-fp16": "100"},
               models="A100,Ascend910B3,MLU370-X8"),
        {"requests": [{"name": "r0", "firstAvailable": [
            {"name": "alt0", **exactly("nvidia.compute.hcs.io", 1,
                                       {"compute": "33", "memory": "16Gi"},
                                       ONLY_A100)},
            {"name": "alt1", **exactly("ascend.compute.hcs.io", 1,
                                       {"compute": "32", "memory": "16Gi"},
                                       'has(a.model) && a.model.lowerAscii() in ["ascend910b3"]')},
            {"name": "alt2", **exactly("cambricon.compute.hcs.io", 2,
                                       {"compute": "0", "memory": "16Gi"},
                                       'has(a.model) && a.model.lowerAscii() in ["mlu370-x8"]')},
        ]}], "constraints": [{"requests": ["r0/alt2"], **UUID}]},
    ),
    "substitution without a model or vendor named: nothing to substitute": (
        demand({"ai.compute/vram": "16Gi"}, allow_substitution="true"),
        {"requests": [{"name": "r0", "exactly": exactly(
            "ai.compute", 1, {"compute": "0", "memory": "16Gi"})}]},
    ),
}  # fmt: skip


@pytest.mark.parametrize(("wanted", "spec"), CASES.values(), ids=CASES.keys())
def test_the_claim_spec_of_each_shape(wanted: Demand, spec: dict[str, Any]) -> None:
    assert claim_spec(wanted, DB) == {"devices": spec}


def test_any_model_for_tflops_is_at_most_eight_alternatives_fewest_devices_first() -> None:
    wanted = demand({"ai.compute/vram": "16Gi", "ai.compute/tflops-fp16": "100"})
    every = alternatives_for(wanted, wanted.containers[0], DB)
    assert len(every) > MAX_ALTERNATIVES  # one per model with TFLOPS and 16Gi: merged below
    chosen = group(every)
    assert len(chosen) == MAX_ALTERNATIVES
    counts = [a.count for a in chosen]
    assert counts == sorted(counts)
    single = [a for a in chosen if a.count == 1]
    assert [a.compute for a in single] == sorted((a.compute for a in single), reverse=True)
    for alternative in chosen:  # a merged alternative never asks less than a model needs
        for member in alternative.members:
            (profile,) = DB.find(member.model)
            own = share_percent(100, profile.figure("tflops_fp16")) if alternative.count == 1 else 0
            assert alternative.compute >= member.compute == own
    # Every model that one device can serve is still offered.
    one_device = {m.model for a in every if a.count == 1 for m in a.members}
    assert one_device == {m.model for a in single for m in a.members}
    spec = claim_spec(wanted, DB)
    assert len(spec["devices"]["requests"][0]["firstAvailable"]) == MAX_ALTERNATIVES


def test_substitutes_come_after_the_named_model_and_only_with_consent() -> None:
    limits = {"ai.compute/vram": "16Gi"}
    strict = claim_spec(demand(limits, models="A100"), DB)
    assert "exactly" in strict["devices"]["requests"][0]
    consent = claim_spec(demand(limits, models="A100", allow_substitution="true"), DB)
    alternatives = consent["devices"]["requests"][0]["firstAvailable"]
    assert 2 <= len(alternatives) <= MAX_ALTERNATIVES
    first = alternatives[0]
    assert first["selectors"][0]["cel"]["expression"] == CEL.format(MODEL_A100)
    assert first["capacity"]["requests"] == {"compute": "0", "memory": "16Gi"}
    # The rest stand for one A100's 312 TFLOPS: an H100 needs 32% of itself, so it is there.
    rest = " ".join(a["selectors"][0]["cel"]["expression"] for a in alternatives[1:])
    assert "h100-sxm5-80gb" in rest and '"a100-sxm4-80gb"' not in rest


def test_each_container_has_its_own_request() -> None:
    pod = {
        "metadata": {"namespace": "team"},
        "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"ai.compute/vram": "8Gi"}}},
            {"name": "sidecar"},
            {"name": "b", "resources": {"limits": {"ai.compute/devices": "1"}}},
        ]},
    }  # fmt: skip
    wanted = demand_of(pod)
    assert wanted is not None
    requests = claim_spec(wanted, DB)["devices"]["requests"]
    assert [r["name"] for r in requests] == ["r0", "r1"]
    assert requests[1]["exactly"]["capacity"]["requests"] == {"compute": "100"}


def test_the_template_name_is_the_shapes_hash() -> None:
    a = claim_spec(demand({"ai.compute/vram": "16Gi"}), DB)
    b = claim_spec(demand({"ai.compute/vram": "16384Mi"}), DB)
    c = claim_spec(demand({"ai.compute/vram": "17Gi"}), DB)
    assert template_name(a) == template_name(b) != template_name(c)
    assert len(template_name(a)) <= 63 and template_name(a).startswith("hcs-")


REFUSALS = {
    "more VRAM than any device": (
        ({"ai.compute/vram": "200Gi"}, {}),
        "ai.compute/vram 200Gi per device is more than any allowed device has (largest: "
        "nvidia/H200-SXM-141GB",
    ),
    "more VRAM than the vendor's devices": (
        ({"ai.compute/vram": "100Gi"}, {"vendors": "ascend"}),
        "(largest: ascend/Ascend910B1 with 64Gi)",
    ),
    "a model of another vendor": (
        ({"ai.compute/vram": "8Gi"}, {"vendors": "nvidia", "models": "Ascend910B3"}),
        "hcs.io/models and hcs.io/vendors allow no model together",
    ),
    "TFLOPS of a model the profiles do not know": (
        ({"ai.compute/tflops-fp16": "10"}, {"models": "Gaudi3"}),
        "no allowed model with a known FP16 TFLOPS figure can serve 10 TFLOPS",
    ),
}


@pytest.mark.parametrize(("request_", "message"), REFUSALS.values(), ids=REFUSALS.keys())
def test_requests_that_cannot_be_met_are_refused_with_the_reason(
    request_: tuple[dict[str, str], dict[str, str]], message: str
) -> None:
    limits, annotations = request_
    with pytest.raises(ShapeError) as refused:
        claim_spec(demand(limits, **annotations), DB)
    assert message in str(refused.value)


def test_more_vram_than_the_named_model_is_fine_when_a_substitute_has_it() -> None:
    wanted = demand({"ai.compute/vram": "60Gi"}, models="A100-SXM4-40GB", allow_substitution="true")
    alternatives = claim_spec(wanted, DB)["devices"]["requests"][0]["firstAvailable"]
    assert "a100-sxm4-80gb" in alternatives[1]["selectors"][0]["cel"]["expression"]
