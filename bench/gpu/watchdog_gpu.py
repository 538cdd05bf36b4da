"""The VRAM watchdog against a real NVIDIA driver (needs a GPU and root; not part of make test).

On device 0, with a container made of a real cgroup (laid out as containerd lays it out) and a
4Gi grant written the way hcsd writes it:
- a process of the container allocates 3Gi through libhcs (bench/gpu/real_cuda.c, holding);
- a process with a CUDA context and no allocation runs outside any container;
- a second process of the container skips libhcs and allocates 6Gi.
Then: what NVML reports per process (the CUDA context's own share included: the figure behind
the per-process tolerance), the cost of the NVML reads and of a whole poll on this driver, and
a poll under the `kill` policy: the container's processes are killed, the host process is
reported and left alone, and the time until the driver stops listing the dead processes.
Prints the figures and writes watchdog_gpu.json to bench/out/ (and $OUT when set).
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.run import PRELOAD, build
from hcsd.contract.quota_file import render_quota
from hcsd.model import Allocation, Device, Grant, PodRef, Vendor
from hcsd.watchdog import Policy, Watchdog
from hcsd.watchdog.accounted import AccountedUsage
from hcsd.watchdog.readers.nvml import NvmlReader
from hcsd.watchdog.settings import WatchdogSection
from tests.watchdog.cgroup import Containers, cgroup_roots

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
MIB = 1 << 20
READS = 200
# A PyTorch process as training code leaves it: a tensor, a matrix product (cuBLAS loaded),
# then it reports what its caching allocator reserved, which is what libhcs would count.
TORCH = """
import sys, torch
x = torch.randn(8192, 8192, device="cuda")
y = x @ x
torch.cuda.synchronize()
print(torch.cuda.memory_reserved(), flush=True)
sys.stdin.read()
"""


def first_gpu() -> Device:
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    assert lib.nvmlInit_v2() == 0
    handle, text, memory = (
        ctypes.c_void_p(),
        ctypes.create_string_buffer(96),
        (ctypes.c_ulonglong * 3)(),
    )
    assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == 0
    assert lib.nvmlDeviceGetUUID(handle, text, 96) == 0
    lib.nvmlDeviceGetMemoryInfo(handle, memory)
    lib.nvmlShutdown()
    return Device(text.value.decode(), Vendor.NVIDIA, "gpu0", 0, "", int(memory[0]))


def timed(work: Any, rounds: int = READS) -> dict[str, float]:
    cpu, wall = [], []
    for _ in range(rounds):
        c, w = time.thread_time(), time.perf_counter()
        work()
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - w)
    return {
        "cpu_ms_mean": round(statistics.fmean(cpu) * 1e3, 3),
        "wall_ms_p50": round(statistics.median(wall) * 1e3, 3),
        "wall_ms_max": round(max(wall) * 1e3, 3),
    }


def main() -> int:
    result: dict[str, Any] = {"benchmark": "watchdog_gpu"}
    roots = cgroup_roots()
    result["cgroup_roots"] = [str(r) for r in roots]
    if not roots:
        print("no writable cgroup hierarchy here: the container part cannot run")
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        program = build(work)
        gpu = first_gpu()
        result["gpu"] = gpu.uuid
        cid = secrets.token_hex(32)
        quota_dir = work / "run" / "containers" / cid
        quota_dir.mkdir(parents=True)
        held = Allocation(cid, (Grant(gpu.uuid, 4 * GIB),), PodRef("bench", "gpu", "u"), "main")
        (quota_dir / "quota.conf").write_text(render_quota(cid, held.grants, [gpu]))
        base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "HCS_CONFIG")}
        base["REAL_CUDA_HOLD_SECONDS"] = "300"
        libhcs = {**base, "LD_PRELOAD": str(PRELOAD), "HCS_CONFIG": str(quota_dir / "quota.conf")}
        containers = Containers(roots)
        container = containers.new(cid)
        started: list[subprocess.Popen[str]] = []
        try:

            def start(argv: list[str], env: dict[str, str], inside: bool) -> subprocess.Popen[str]:
                if inside:
                    process = container.spawn(argv, env=env)
                    process = _text(process)
                else:
                    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
                started.append(process)
                assert process.stdout is not None
                lines = [process.stdout.readline().strip()]
                while not lines[-1].startswith("meminfo"):
                    lines.append(process.stdout.readline().strip())
                result.setdefault("workloads", []).append({"pid": process.pid, "said": lines})
                return process

            honest = start([str(program), "quota", "3"], libhcs, True)
            context_only = start([str(program), "quota", "0"], base, False)
            escaped = start([str(program), "quota", "6"], base, True)
            reader = NvmlReader([gpu], library="")  # the loader's search path, as hcsd by default
            sample = reader.read()
            result["nvml_abi"] = reader.abi
            result["nvml_per_process_mib"] = {
                str(p.pid): round(p.used_bytes / MIB, 1) for p in sample.processes
            }
            result["context_only_mib"] = result["nvml_per_process_mib"].get(str(context_only.pid))
            result["cost_nvml_read_one_gpu"] = timed(reader.read)
            warn = Watchdog(
                [reader],
                lambda: [held],
                lambda v: None,
                WatchdogSection(policy=Policy.WARN).watchdog_settings(),
                accounted=AccountedUsage(work / "run"),
            )
            result["cost_whole_poll_one_gpu"] = timed(warn.poll)
            assessment = warn.poll().assessment
            result["assessment"] = [
                {
                    "used_mib": round(u.used_bytes / MIB, 1),
                    "granted_mib": u.granted_bytes // MIB,
                    "allowed_mib": round(u.allowed_bytes / MIB, 1),
                    "accounted_mib": None
                    if u.accounted_bytes is None
                    else round(u.accounted_bytes / MIB, 1),
                    "pids": list(u.pids),
                    "over": u.over,
                }
                for u in assessment.containers
            ]
            result["strays"] = [
                {"pid": s.pid, "mib": round(s.used_bytes / MIB, 1)} for s in assessment.strays
            ]
            events: list[Any] = []
            kill = Watchdog(
                [reader],
                lambda: [held],
                events.append,
                WatchdogSection(policy=Policy.KILL).watchdog_settings(),
                accounted=AccountedUsage(work / "run"),
            )
            kill.poll()
            result["events"] = [
                {"action": e.action, "used_mib": round(e.used_bytes / MIB, 1), "pids": list(e.pids)}
                for e in events
            ]
            killed_at = time.monotonic()
            for process in (honest, escaped):
                process.wait(timeout=30)
            result["exit_codes"] = {"honest": honest.returncode, "escaped": escaped.returncode}
            gone = {honest.pid, escaped.pid}
            while gone & {p.pid for p in reader.read().processes}:
                time.sleep(0.005)
            result["driver_released_ms"] = round((time.monotonic() - killed_at) * 1e3, 1)
            result["context_only_alive"] = context_only.poll() is None
            result["torch"] = torch_overhead(reader)
            reader.close()
        finally:
            for process in started:
                if process.poll() is None:
                    process.kill()
                process.wait()
            containers.close()
    text = json.dumps(result, indent=2)
    print(text)
    for out in [ROOT / "bench" / "out", Path(os.environ["OUT"]) if os.environ.get("OUT") else None]:
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "watchdog_gpu.json").write_text(text + "\n")
    return 0


def torch_overhead(reader: NvmlReader) -> dict[str, Any] | str:
    """NVML's figure for a PyTorch process against what its allocator reserved: the part no
    allocation call returns (context, loaded modules), which the tolerance must cover."""
    process = subprocess.Popen(
        [sys.executable, "-c", TORCH], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        if not line.isdigit():
            return f"skipped: {line or 'torch did not start'}"
        nvml = next(p.used_bytes for p in reader.read().processes if p.pid == process.pid)
        reserved = int(line)
        return {
            "reserved_mib": round(reserved / MIB, 1),
            "nvml_mib": round(nvml / MIB, 1),
            "beyond_allocations_mib": round((nvml - reserved) / MIB, 1),
        }
    finally:
        process.kill()
        process.wait()


def _text(process: subprocess.Popen[bytes]) -> subprocess.Popen[str]:
    """Container.spawn gives a bytes pipe; read it as text lines."""
    import io

    assert process.stdout is not None
    process.stdout = io.TextIOWrapper(process.stdout)  # type: ignore[assignment]
    return process  # type: ignore[return-value]


if __name__ == "__main__":
    sys.exit(main())
