"""Starting one measurement's worker process and bounding it.

The worker sees only its device, through the vendor's visibility variable (the GPU's UUID for
CUDA; the index for HIP, whose ordinals follow the same PCI order hy-smi reports, and for
AscendCL, whose logical ids are the NPU ids npu-smi and DCMI report). While it runs,
`interrupt` is asked every `poll` seconds whether to stop (an allocation took the device); the
worker is then killed, as it is when `timeout` passes. Only this process's own child is ever
signalled, and it runs in a session of its own so nothing else shares its fate.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from hcsd.benchmarks.libraries import BenchmarkError
from hcsd.benchmarks.request import GemmRequest
from hcsd.model import Device, Vendor
from hcsd.tasks import supervise

__all__ = ["MEASURABLE", "Interrupted", "run_worker"]

#: The vendors a measurement exists for, and how the worker is shown its one device.
MEASURABLE: dict[Vendor, Callable[[Device], dict[str, str]]] = {
    Vendor.NVIDIA: lambda d: {"CUDA_VISIBLE_DEVICES": d.uuid},
    Vendor.HYGON: lambda d: {"HIP_VISIBLE_DEVICES": str(d.index)},
    Vendor.ASCEND: lambda d: {"ASCEND_RT_VISIBLE_DEVICES": str(d.index)},
}


class Interrupted(BenchmarkError):
    """The worker was stopped on purpose (the device was wanted) and left no figure."""


async def run_worker(
    device: Device,
    request: GemmRequest,
    *,
    timeout: float,
    interrupt: Callable[[], str | None] = lambda: None,
    poll: float = 0.02,
    python: str = sys.executable,
) -> dict[str, Any]:
    """The worker's JSON result for one device; raises BenchmarkError (Interrupted when
    `interrupt` answered a reason) with what went wrong."""
    visible = MEASURABLE.get(device.vendor)
    if visible is None:
        raise BenchmarkError(f"no GEMM measurement for {device.vendor.value} devices yet")
    env = {**os.environ, **visible(device)}
    request = dataclasses.replace(request, pci_bus_id=device.pci_bus_id)  # checked there
    process = await asyncio.create_subprocess_exec(
        python, "-m", "hcsd.benchmarks.worker", request.to_json(),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True,
    )  # fmt: skip
    reading = supervise(process.communicate(), f"measure-{device.uuid}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while not reading.done():
            await asyncio.wait({reading}, timeout=poll)
            if reading.done():
                break
            if (why := interrupt()) is not None:
                raise Interrupted(f"stopped: {why}")
            if loop.time() >= deadline:
                raise BenchmarkError(f"no result within {timeout:g}s: the worker was killed")
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()  # our own child, by its pid
            await process.wait()
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
    out, err = reading.result()
    return _parse(out, err, process.returncode)


def _parse(out: bytes, err: bytes, code: int | None) -> dict[str, Any]:
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        result = None
    if not isinstance(result, dict):
        tail = err.decode(errors="replace").strip().splitlines()[-3:]
        raise BenchmarkError(f"worker ended with status {code} and no result: {' | '.join(tail)}")
    if not result.get("ok"):
        error = BenchmarkError(str(result.get("error", "unknown error")))
        error.permanent = bool(result.get("permanent"))
        raise error
    return result
