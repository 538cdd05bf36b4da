"""Kubernetes quantity parsing (`16Gi`, `100`, `1.5T`, `500m`, `1e3`).

Users write VRAM and TFLOPS the way they write any Kubernetes resource, so HCS accepts exactly
that grammar and nothing looser: a typo such as `16GB` or `16 Gi` must be refused with a message
that names the accepted suffixes rather than silently read as something else.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

__all__ = ["QuantityError", "format_bytes", "parse_bytes", "parse_quantity"]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_PATTERN = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?$"
)
_SUFFIXES = "Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent such as 1e9"
_MAX_LEN = 64


class QuantityError(ValueError):
    """A quantity string that is not valid Kubernetes quantity syntax, or out of range."""


def parse_quantity(text: str) -> Decimal:
    """Parse a Kubernetes quantity into an exact decimal value.

    Exactness matters: `1.5Gi` must be 1610612736 bytes, not a float approximation of it.
    """
    if not isinstance(text, str):
        raise QuantityError(f"quantity must be a string, got {type(text).__name__}")
    if len(text) > _MAX_LEN:
        raise QuantityError(f"quantity is too long ({len(text)} characters, at most {_MAX_LEN})")
    match = _PATTERN.match(text)
    if match is None:
        raise QuantityError(
            f"invalid quantity {text!r}: expected a number with an optional suffix ({_SUFFIXES})"
        )
    try:
        value = Decimal(match["number"])
    except InvalidOperation as e:  # pragma: no cover - the regex admits only digits
        raise QuantityError(f"invalid quantity {text!r}: bad number") from e
    suffix, exponent = match["suffix"], match["exponent"]
    if exponent is not None:
        if abs(int(exponent)) > 30:
            raise QuantityError(f"invalid quantity {text!r}: exponent out of range")
        value = value.scaleb(int(exponent))
    elif suffix in _BINARY:
        value *= _BINARY[suffix]
    else:
        value *= _DECIMAL[suffix or ""]
    return -value if match["sign"] == "-" else value


def parse_bytes(text: str, *, what: str = "quantity") -> int:
    """Parse a non-negative byte count; fractions of a byte round up, as Kubernetes does."""
    try:
        value = parse_quantity(text)
    except QuantityError as e:
        raise QuantityError(f"{what}: {e}") from e
    if value < 0:
        raise QuantityError(f"{what}: must not be negative, got {text!r}")
    result = int(value.to_integral_value(rounding=ROUND_CEILING))
    if result >= 2**63:
        raise QuantityError(f"{what}: {text!r} is too large")
    return result


def format_bytes(count: int) -> str:
    """Render bytes in the largest binary unit that keeps one decimal (`79.6Gi`, `512Mi`)."""
    if count < 0:
        return "-" + format_bytes(-count)
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if count >= unit:
            value = count / unit
            text = f"{value:.1f}".rstrip("0").rstrip(".")
            return f"{text}{suffix}"
    return str(count)
