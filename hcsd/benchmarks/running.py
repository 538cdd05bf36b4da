"""Starting one measurement's worker process and bounding it.

The worker sees only its device, through the vendor's visibility variable (the GPU's UUID for
CUDA; the index for HIP, whose ordinals follow the same PCI order hy-smi reports, and for
AscendCL, whose logical ids are the NPU ids npu-smi and DCMI report). While it runs,
`interrupt` is asked every `poll` seconds whether to stop (an allocation took the device); the
worker is then killed, as it is when `timeout` passes. The worker runs in a session and process
group of its own, and that group is what is killed: the worker and anything it started (a
vendor library's helper), nothing else. The worker asks the kernel to kill it if hcsd dies
(PR_SET_PDEATHSIG), gets a minimal environment (benchmarks.environment) and runs with `-I`.

Memory: the worker runs in hcsd's cgroup, so the unit's MemoryMax (1G) covers both. A vendor
runtime maps large host allocations (CUDA's context, CANN's op cache), so the limit has to
leave room for one worker; the OOM killer would pick the worker (the bigger process) first,
and hcsd would record a failure. Running it in a transient scope (systemd-run --scope) would
need systemd and D-Bus access the unit does not grant, so it is not done.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from hcsd.benchmarks import environment
from hcsd.benchmarks.libraries import BenchmarkError
from hcsd.benchmarks.request import GemmRequest
from hcsd.benchmarks.worker import PARENT_VARIABLE
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
    worker_env: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The worker's JSON result for one device; raises BenchmarkError (Interrupted when
    `interrupt` answered a reason) with what went wrong. `worker_env`: the environment's
    entries (benchmarks.environment; None: its defaults)."""
    visible = MEASURABLE.get(device.vendor)
    if visible is None:
        raise BenchmarkError(f"no GEMM measurement for {device.vendor.value} devices yet")
    entries = environment.DEFAULT_WORKER_ENV if worker_env is None else worker_env
    env = {**environment.worker_environment(entries), **visible(device)}
    env[PARENT_VARIABLE] = str(os.getpid())
    request = dataclasses.replace(request, pci_bus_id=device.pci_bus_id)  # checked there
    try:
        # -I: no PYTHON* variables, no user site, not the current directory on sys.path
        process = await asyncio.create_subprocess_exec(
            python, "-I", "-m", "hcsd.benchmarks.worker", request.to_json(),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True,
        )  # fmt: skip
    except OSError as e:
        raise BenchmarkError(f"failed to start the measuring process {python}: {e}") from e
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
                # the process group our child leads (its own session): it and anything it
                # started; not yet reaped, so the id cannot have been reused
                os.killpg(process.pid, signal.SIGKILL)
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
