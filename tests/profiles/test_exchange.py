"""The converter: devices per model for a need, and exchange rates between models."""

from __future__ import annotations

import pytest

from hcsd.allocator import choose
from hcsd.cluster.demand import demand_of
from hcsd.cluster.planner import Plan, plan
from hcsd.model import Request
from hcsd.profiles import default_database
from hcsd.profiles.exchange import (
    ConversionError,
    convert,
    devices_as_tflops,
    devices_for,
    parse_need,
    share_percent,
    share_tflops,
)
from tests.conftest import gpu

GiB = 2**30


@pytest.mark.parametrize(
    ("text", "figure", "amount"),
    [
        pytest.param("100 TFLOPS fp16", "tflops_fp16", 100.0, id="tflops"),
        pytest.param("100 tflops", "tflops_fp16", 100.0, id="default-fp16"),
        pytest.param("50 TFLOPS bf16", "tflops_bf16", 50.0, id="bf16"),
        pytest.param("400 TOPS int8", "tops_int8", 400.0, id="int8"),
        pytest.param("vram 160Gi", "vram_bytes", 160.0 * GiB, id="vram"),
        pytest.param("160Gi vram", "vram_bytes", 160.0 * GiB, id="vram-after"),
        pytest.param("500 ACU", "acu", 500.0, id="acu"),
        pytest.param("2 nvidia/A100-80G", "tflops_fp16", 624.0, id="devices"),
    ],
)
def test_needs_parse(text: str, figure: str, amount: float) -> None:
    need = parse_need(text, default_database())
    assert (need.figure, need.amount) == (figure, pytest.approx(amount))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("fast please", "cannot read need", id="words"),
        pytest.param("100 TFLOPS int8", "TFLOPS takes one of", id="bad-precision"),
        pytest.param("vram 16GB", "invalid quantity", id="bad-vram"),
        pytest.param("1.5 nvidia/A100-80G", "whole", id="fractional-devices"),
        pytest.param("2 ascend/910B", "must name one model", id="ambiguous"),
        pytest.param("0 TFLOPS", "positive", id="zero"),
    ],
)
def test_bad_needs_are_refused(text: str, message: str) -> None:
    with pytest.raises(ConversionError, match=message):
        parse_need(text, default_database())


def test_tflops_need_counts_devices_per_model() -> None:
    db = default_database()
    result = convert(parse_need("1000 TFLOPS fp16", db), db)
    devices = {o.profile.model: o.devices for o in result.options}
    assert devices["A100-SXM4-80GB"] == 4  # 1000 / 312 = 3.2
    assert devices["H100-SXM5-80GB"] == 2  # 1000 / 989.4 = 1.01
    assert devices["T4"] == 16  # 1000 / 65 = 15.4
    assert result.options[0].devices <= result.options[-1].devices


def test_models_without_the_figure_are_skipped_with_a_reason() -> None:
    db = default_database()
    result = convert(parse_need("100 TFLOPS bf16", db), db)
    skipped = {p.model: reason for p, reason in result.skipped}
    assert skipped["T4"] == "no published tflops_bf16"
    assert all(o.profile.model != "T4" for o in result.options)


def test_exchange_rate_to_a_named_model() -> None:
    db = default_database()
    result = convert(parse_need("8 nvidia/A100-80G", db), db, to="ascend/910B3")
    [option] = result.options
    assert option.devices == 8  # 8 x 312 / 313 = 7.97
    [rate] = result.rates
    assert rate.rate == pytest.approx(312 / 313)


def test_vram_need_uses_device_memory() -> None:
    db = default_database()
    result = convert(parse_need("vram 160Gi", db), db, to="nvidia/A100-80G")
    assert [o.devices for o in result.options] == [2]


@pytest.mark.parametrize(
    ("amount", "per_device", "devices", "percent"),
    [
        pytest.param(3 * 312.0, 312.0, 3, 100, id="exact-multiple-despite-float-noise"),
        pytest.param(0.1 * 3, 0.3, 1, 100, id="float-noise-at-one"),
        pytest.param(313.0, 312.0, 2, 100, id="just-over"),
        pytest.param(100.0, 312.0, 1, 33, id="a-share"),
        pytest.param(0.001, 312.0, 1, 1, id="smallest-share"),
    ],
)
def test_the_one_conversion(amount: float, per_device: float, devices: int, percent: int) -> None:
    assert devices_for(amount, per_device) == devices
    assert share_percent(amount, per_device) == percent
    assert share_tflops(per_device, 25) == per_device / 4


def test_a_name_for_several_models_stands_for_the_weakest() -> None:
    db = default_database()
    b_series = db.find("ascend/910B")
    assert len(b_series) > 1
    weakest = min(p.figure("tflops_fp16") for p in b_series)
    assert devices_as_tflops(2, b_series) == 2 * weakest
    assert devices_as_tflops(2, []) is None


@pytest.mark.parametrize("amount", [1.0, 100.0, 312.0, 3 * 312.0, 1000.0, 2496.0])
def test_hcsd_places_the_devices_hcsctl_convert_names(amount: float) -> None:
    """hcsd's allocator (on the node and in the extender) and `hcsctl convert` agree."""
    db = default_database()
    [a100] = db.find("nvidia/A100-SXM4-80GB")
    devices = [gpu(i, tflops=a100.figure("tflops_fp16")) for i in range(8)]
    placement = choose(Request("c", vram_bytes=GiB, tflops_fp16=amount), devices, {})
    [option] = convert(parse_need(f"{amount} TFLOPS fp16", db), db, to=a100.key).options
    assert len(placement.grants) == option.devices
    if option.devices == 1:
        assert placement.grants[0].compute_percent == share_percent(amount, option.per_device)


def test_substitution_asks_what_hcsctl_convert_reads_for_n_devices() -> None:
    """The extender's substitution: N named devices become N x their FP16, as in convert."""
    db = default_database()
    need = parse_need("2 nvidia/A100-SXM4-80GB", db)
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u",
            "annotations": {
                "hcs.io/models": "A100-SXM4-80GB",
                "hcs.io/allow-substitution": "true",
            },
        },
        "spec": {
            "containers": [{"name": "main", "resources": {"limits": {"ai.compute/devices": "2"}}}]
        },
    }
    demand = demand_of(pod)
    assert demand is not None
    t4s = [gpu(i, model="T4", vram_gib=16, tflops=65.0) for i in range(16)]
    found = plan(demand, t4s, {}, db)
    assert isinstance(found, Plan) and found.substituted
    [t4] = db.find("nvidia/T4")
    [option] = convert(need, db, to=t4.key).options
    assert len(found.grants["main"]) == option.devices == 10  # 624 / 65 = 9.6
