"""Checking that a worker landed on the device it was meant for.

The worker is shown its device through the vendor's visibility variable, whose numbering is
the runtime's, not necessarily the discovery's (a Hygon KFD index against HIP's order; CANN's
logical ids under container remapping). A figure recorded against the wrong device would rate
one card by another's speed, so the worker requires exactly one visible device and, where the
runtime reports it, that device's PCI bus id to be the one discovery found; otherwise it fails
permanently, before anything is allocated.
"""

from __future__ import annotations

from hcsd.benchmarks.libraries import BenchmarkError

__all__ = ["WrongDevice", "check_device", "same_bus"]


class WrongDevice(BenchmarkError):
    """The runtime shows another device (or several): retrying cannot help."""

    permanent = True


def _parts(bus_id: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) of `0000:17:00.0` / `00000000:17:00.0` (any case)."""
    try:
        domain, bus, rest = bus_id.strip().split(":")
        device, function = rest.split(".")
        return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)
    except ValueError:
        return None


def same_bus(a: str, b: str) -> bool:
    """Whether two spellings of a PCI address name the same function (NVML writes an 8-digit
    domain, CUDA and HIP 4 digits, in either case)."""
    left, right = _parts(a), _parts(b)
    return left is not None and left == right


def check_device(count: int, bus_id: str | None, expected: str) -> None:
    """Raise WrongDevice unless exactly one device is visible and, when both are known, its
    bus id is `expected`."""
    if count != 1:
        raise WrongDevice(f"the runtime shows {count} devices, expected exactly 1")
    if expected and bus_id is not None and not same_bus(bus_id, expected):
        raise WrongDevice(f"the runtime's device is at {bus_id}, not at {expected}")
