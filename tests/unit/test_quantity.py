from __future__ import annotations

from decimal import Decimal

import pytest

from hcsd.quantity import QuantityError, format_bytes, parse_bytes, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("16Gi", Decimal(16 * 2**30), id="binary-gi"),
        pytest.param("100", Decimal(100), id="plain"),
        pytest.param("1.5T", Decimal("1.5e12"), id="decimal-fraction"),
        pytest.param("500m", Decimal("0.5"), id="milli"),
        pytest.param("1.5Gi", Decimal(1610612736), id="binary-fraction-exact"),
        pytest.param("1e3", Decimal(1000), id="exponent"),
        pytest.param("2E-1", Decimal("0.2"), id="negative-exponent"),
        pytest.param(".5", Decimal("0.5"), id="leading-dot"),
        pytest.param("+3k", Decimal(3000), id="plus-sign"),
        pytest.param("-1Mi", Decimal(-(2**20)), id="negative"),
        pytest.param("0", Decimal(0), id="zero"),
    ],
)
def test_parse_quantity(text: str, expected: Decimal) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("16GB", id="not-a-k8s-suffix"),
        pytest.param("16 Gi", id="space"),
        pytest.param("Gi", id="suffix-only"),
        pytest.param("1.2.3", id="two-dots"),
        pytest.param("0x10", id="hex"),
        pytest.param("1e99", id="exponent-too-large"),
        pytest.param("1" * 65, id="too-long"),
        pytest.param("16gi", id="wrong-case"),
    ],
)
def test_parse_quantity_refuses(text: str) -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity(text)
    assert text[:10] in str(info.value) or "too long" in str(info.value) or not text


def test_bad_suffix_message_lists_accepted_suffixes() -> None:
    with pytest.raises(QuantityError, match=r"invalid quantity '16GB'.*Ki Mi Gi"):
        parse_quantity("16GB")


def test_parse_bytes_rounds_fractions_up() -> None:
    assert parse_bytes("500m") == 1
    assert parse_bytes("1.5") == 2


def test_parse_bytes_refuses_negative_and_names_the_field() -> None:
    with pytest.raises(QuantityError, match=r"^vram: must not be negative"):
        parse_bytes("-1Gi", what="vram")


def test_parse_quantity_refuses_non_string() -> None:
    with pytest.raises(QuantityError, match="must be a string"):
        parse_quantity(16)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("count", "text"),
    [(0, "0"), (1023, "1023"), (2**20, "1Mi"), (80 * 2**30, "80Gi"), (int(1.5 * 2**30), "1.5Gi")],
)
def test_format_bytes(count: int, text: str) -> None:
    assert format_bytes(count) == text
