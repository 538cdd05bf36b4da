"""`python -m hcsd.benchmarks.worker REQUEST-JSON`: one measurement, in a process of its own.

hcsd never loads a vendor's math library or holds a device context itself: a library that
crashes or hangs takes this process with it, not the daemon; hcsd bounds the time by killing
it; and whatever it held on the device (context, buffers) is gone when it exits, whichever way
it ends. The device is the one the vendor's visibility variable names (ordinal 0).

Prints one JSON line: `{"ok": true, "tflops": …, "seconds": …, "iterations": …,
"bandwidth_gbps": …, "library": …, "m": …}` or `{"ok": false, "error": …, "permanent": …}`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from hcsd.benchmarks.libraries import BenchmarkError
from hcsd.benchmarks.request import GemmRequest
from hcsd.benchmarks.timing import time_kernel

__all__ = ["PARENT_VARIABLE", "main", "measure"]


def _kernel(request: GemmRequest) -> Any:
    if request.vendor == "nvidia":
        from hcsd.benchmarks.nvidia import CublasGemm

        return CublasGemm(request)
    if request.vendor == "hygon":
        from hcsd.benchmarks.hygon import RocblasGemm

        return RocblasGemm(request)
    if request.vendor == "ascend":
        from hcsd.benchmarks.ascend import AclblasGemm

        return AclblasGemm(request)
    raise BenchmarkError(f"no GEMM measurement for {request.vendor} devices yet")


def measure(request: GemmRequest) -> dict[str, Any]:
    """The figures, or the error, as the JSON line says them."""
    try:
        kernel = _kernel(request)
        try:
            figures = time_kernel(
                kernel, request.duration, warmup=request.warmup, bandwidth=request.bandwidth
            )
        finally:
            kernel.close()
    except BenchmarkError as e:
        return {"ok": False, "error": str(e), "permanent": e.permanent}
    return {
        "ok": True,
        "tflops": figures.tflops,
        "seconds": figures.seconds,
        "iterations": figures.iterations,
        "bandwidth_gbps": figures.bandwidth_gbps,
        "library": kernel.library,
        "size": request.size,
    }


PR_SET_PDEATHSIG = 1
PARENT_VARIABLE = "HCS_WORKER_PARENT"


def _die_with_parent() -> None:
    """SIGKILL this process when hcsd (its parent, whose pid `running` passes in
    HCS_WORKER_PARENT) dies: a crashed hcsd leaves no worker holding a device. If the parent
    is already gone (died before the request took effect), exit now."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    expected = os.environ.get(PARENT_VARIABLE, "")
    if expected.isdigit() and os.getppid() != int(expected):
        sys.exit(3)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        _die_with_parent()
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print(json.dumps({"ok": False, "error": "usage: worker REQUEST-JSON", "permanent": True}))
        return 2
    try:
        request = GemmRequest.from_json(args[0])
    except (ValueError, TypeError) as e:
        print(json.dumps({"ok": False, "error": f"bad request: {e}", "permanent": True}))
        return 2
    result = measure(request)
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
