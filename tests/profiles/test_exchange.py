"""The converter: devices per model for a need, and exchange rates between models."""

from __future__ import annotations

import pytest

from hcsd.profiles import default_database
from hcsd.profiles.exchange import ConversionError, convert, parse_need

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
