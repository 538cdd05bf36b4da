"""libhcs and NVML discovery against a real NVIDIA driver (needs a GPU; not part of make test).

What it checks and measures on device 0, with a 16Gi quota written the way hcsd writes it:
- the driver API (bench/gpu/real_cuda.c, dlopen + dlsym like the CUDA runtime): without libhcs
  10Gi + 10Gi both succeed; with it the second is refused with CUDA_ERROR_OUT_OF_MEMORY and
  cuMemGetInfo reports 16Gi total; a second process sharing the container's region is refused
  while the first holds 10Gi;
- PyTorch (if installed): torch.empty of 10Gi succeeds, a second 10Gi raises OutOfMemoryError,
  torch.cuda.mem_get_info() reports the quota;
- nvidia-smi under the preload reports the quota as total memory (NVML hook);
- cost: median ns per cuMemAlloc_v2 + cuMemFree_v2 pair with and without libhcs;
- hcsd's NVML discovery backend: the devices it reports (model, memory, bus id, links);
- hcsd's measured fingerprint on device 0 (hcsd/benchmarks: a dense FP16 GEMM through the real
  cuBLAS in hcsd's worker process, FP32 and FP16 accumulation, and a device-to-device copy):
  TFLOPS, ratio to the profile's figure, GB/s. cuBLAS is looked for in the CUDA toolkit's
  lib64 and in the nvidia-cublas-cu12 wheel that PyTorch installs.
Prints the figures and writes bench/out/gpu.json (and $OUT/gpu.json when OUT is set).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
LIBHCS = ROOT / "libhcs"
PRELOAD = LIBHCS / "build" / "libhcs.so"
OUT = ROOT / "bench" / "out"
GIB = 1 << 30


def build(work: Path) -> Path:
    subprocess.run(["make", "-s", "-C", str(LIBHCS), "all"], check=True)
    program = work / "real_cuda"
    subprocess.run(
        [
            "cc",
            "-O2",
            f"-I{LIBHCS / 'include'}",
            "-o",
            str(program),
            str(Path(__file__).with_name("real_cuda.c")),
            "-ldl",
        ],
        check=True,
    )
    return program


def gpu_uuid() -> str:
    import pynvml

    pynvml.nvmlInit()
    try:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
        return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    finally:
        pynvml.nvmlShutdown()


def quota_file(work: Path, uuid: str, limit: int) -> Path:
    """quota.conf written by hcsd's own writer, one NVIDIA device."""
    from hcsd.contract.quota_file import DeviceQuota, render

    directory = work / "container"
    directory.mkdir()
    path = directory / "quota.conf"
    path.write_text(render("gpu-check", [DeviceQuota(uuid, "nvidia", limit, 100)]))
    return path


def env_for(config: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "HCS_CONFIG")}
    if config is not None:
        env["LD_PRELOAD"] = str(PRELOAD)
        env["HCS_CONFIG"] = str(config)
    return env


def run(args: list[str], config: Path | None, **extra: str) -> str:
    result = subprocess.run(
        args,
        check=False,
        env={**env_for(config), **extra},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return (result.stdout + result.stderr).strip()


TORCH_CHECK = """
import torch
a = torch.empty(10 << 30, dtype=torch.uint8, device="cuda")
print("first 10GiB ok")
try:
    b = torch.empty(10 << 30, dtype=torch.uint8, device="cuda")
    print("second 10GiB ALLOWED")
except torch.OutOfMemoryError as e:
    print("second 10GiB refused:", str(e).splitlines()[0][:160])
free, total = torch.cuda.mem_get_info()
print(f"mem_get_info free={free} total={total}")
"""


def discovery() -> list[dict[str, object]]:
    from hcsd.discovery.backends.nvidia import NvidiaBackend
    from hcsd.discovery.settings import DiscoverySection

    backend = NvidiaBackend(DiscoverySection())  # the defaults: the loader finds NVML
    devices = backend.discover()
    return [
        {
            "uuid": d.uuid,
            "model": d.model,
            "vram_bytes": d.vram_bytes,
            "pci_bus_id": d.pci_bus_id,
            "numa_node": d.numa_node,
            "tflops_fp16": d.tflops_fp16,
            "nodes": [str(n) for n in d.device_nodes],
            "attributes": dict(d.attributes),
        }
        for d in devices
    ]


def cublas_dirs() -> tuple[str, ...]:
    """Where cuBLAS may be: hcsd's default library path, and the pip wheel's directory."""
    from hcsd.benchmarks.settings import DEFAULT_LIBRARY_PATH

    found = list(DEFAULT_LIBRARY_PATH)
    try:
        import nvidia.cublas  # type: ignore[import-not-found]

        found += [str(Path(p) / "lib") for p in nvidia.cublas.__path__]
    except ImportError:
        pass
    return tuple(found)


def measurement(uuid: str) -> dict[str, object]:
    """hcsd's measurement of the GPU, run exactly as the daemon runs it (run_worker)."""
    import asyncio

    from hcsd.benchmarks.request import GemmRequest
    from hcsd.benchmarks.running import run_worker
    from hcsd.model import Device, Vendor
    from hcsd.profiles import default_database

    found = discovery()
    model = str(next((d["model"] for d in found if d["uuid"] == uuid), ""))
    profile = default_database().lookup(Vendor.NVIDIA, model)
    reference = profile.figure("tflops_fp16") if profile else 0.0
    device = Device(uuid, Vendor.NVIDIA, model, index=0, pci_bus_id="", vram_bytes=0)
    figures: dict[str, object] = {"model": model, "profile_tflops_fp16": reference}
    for accumulate in ("fp32", "fp16"):
        request = GemmRequest(vendor="nvidia", compute=accumulate, library_path=cublas_dirs())
        started = time.monotonic()
        try:
            result = asyncio.run(run_worker(device, request, timeout=120))
        except Exception as e:  # report, do not hide
            figures[accumulate] = f"failed: {e}"
            continue
        result["wall_seconds"] = round(time.monotonic() - started, 2)
        if reference:
            result["ratio"] = round(float(result["tflops"]) / reference, 3)
        figures[accumulate] = result
    return figures


def main() -> int:
    result: dict[str, object] = {"benchmark": "gpu", "time": time.strftime("%FT%TZ", time.gmtime())}
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        program = build(work)
        uuid = gpu_uuid()
        config = quota_file(work, uuid, 16 * GIB)
        result["gpu_uuid"] = uuid
        result["bare_10_10"] = run([str(program), "quota", "10", "10"], None)
        result["hooked_10_10"] = run([str(program), "quota", "10", "10"], config)
        holder = subprocess.Popen(
            [str(program), "quota", "10"],
            env={**env_for(config), "REAL_CUDA_HOLD_SECONDS": "8"},
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None
        first = holder.stdout.readline() + holder.stdout.readline()
        result["two_processes"] = {
            "holder": first.strip(),
            "peer": run([str(program), "quota", "10"], config),
        }
        holder.wait(timeout=60)
        pairs = {}
        for name, cfg in (("unhooked", None), ("hooked", config)):
            pairs[name] = float(run([str(program), "pairs", "2000", "9"], cfg).split()[-1])
        result["pair_ns_median"] = pairs
        result["pair_ns_added"] = round(pairs["hooked"] - pairs["unhooked"], 1)
        if shutil.which("nvidia-smi"):
            query = ["nvidia-smi", "--query-gpu=name,memory.total,memory.used", "--format=csv"]
            result["nvidia_smi_bare"] = run(query, None)
            result["nvidia_smi_hooked"] = run(query, config)
        try:
            import torch  # noqa: F401

            result["torch"] = run([sys.executable, "-c", TORCH_CHECK], config)
        except ImportError:
            result["torch"] = "skipped: torch is not installed"
    try:
        result["discovery"] = discovery()
    except Exception as e:  # report, do not hide: the figures above still count
        result["discovery"] = f"failed: {e!r}"
    try:
        result["measured_fingerprint"] = measurement(str(result["gpu_uuid"]))
    except Exception as e:
        result["measured_fingerprint"] = f"failed: {e!r}"
    text = json.dumps(result, indent=2, default=str)
    print(text)
    for out in [OUT, Path(os.environ["OUT"]) if os.environ.get("OUT") else None]:
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "gpu.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
