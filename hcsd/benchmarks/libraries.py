"""Loading a vendor library and binding its functions with ctypes.

The declarations are ours, written from the vendors' public headers; a symbol the library does
not export is a permanent error that names the library and the symbol, so the log says which
part of the toolkit is too old or missing.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["HALF_ONE", "BenchmarkError", "Library", "LibraryError", "named_status", "scalars"]

HALF_ONE = 0x3C00  # 1.0 as an IEEE half


def named_status(table: dict[int, str], fallback: str = "status") -> Callable[[int], str]:
    """A vendor status code as its header's name and number, for error messages."""
    return lambda status: f"{table.get(status, fallback)} ({status})"


def scalars(compute: str) -> tuple[Any, Any]:
    """GEMM's alpha = 1 and beta = 0 in the compute type's width: FP32 or FP16 (half)."""
    if compute == "fp32":
        return ctypes.c_float(1.0), ctypes.c_float(0.0)
    return ctypes.c_uint16(HALF_ONE), ctypes.c_uint16(0)


class BenchmarkError(Exception):
    """A measurement failed; `permanent` when retrying on this node cannot help (a library or
    symbol is missing) rather than a condition of the moment (a device error, a timeout)."""

    permanent = False


class LibraryError(BenchmarkError):
    """A vendor library cannot be loaded, or lacks a function the measurement needs."""

    permanent = True


class Library:
    """One loaded library: the first of `names` found in `directories`, then on the loader's
    search path."""

    def __init__(self, names: Sequence[str], directories: Sequence[str] = ()) -> None:
        tried: list[str] = []
        for name in names:
            for candidate in [os.path.join(d, name) for d in directories] + [name]:
                if os.sep in candidate and not os.path.exists(candidate):
                    continue
                try:
                    self.cdll = ctypes.CDLL(candidate)
                except OSError as e:
                    tried.append(str(e))
                    continue
                self.name = name
                self.path = candidate
                return
        raise LibraryError(f"failed to load {' or '.join(names)}: " + "; ".join(tried))

    def function(self, symbol: str, argtypes: Sequence[Any], restype: Any = ctypes.c_int) -> Any:
        """The function with its declared argument and result types."""
        try:
            found = getattr(self.cdll, symbol)
        except AttributeError:
            raise LibraryError(f"{self.name} has no symbol {symbol}") from None
        found.argtypes = list(argtypes)
        found.restype = restype
        return found

    def checked(
        self, symbol: str, argtypes: Sequence[Any], describe: Callable[[int], str]
    ) -> Callable[..., None]:
        """The function, raising BenchmarkError with `describe(status)` when it returns one
        other than 0 (every vendor here uses 0 for success)."""
        function = self.function(symbol, argtypes)

        def call(*args: Any) -> None:
            status = function(*args)
            if status != 0:
                raise BenchmarkError(f"{symbol} returned {describe(status)}")

        call.__name__ = symbol
        return call
