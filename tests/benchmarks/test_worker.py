"""One measurement in its worker process, through the fake cuBLAS and driver."""

from __future__ import annotations

import asyncio
import ctypes.util
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hcsd.benchmarks.libraries import BenchmarkError
from hcsd.benchmarks.placement import WrongDevice, check_device, same_bus
from hcsd.benchmarks.running import Interrupted, run_worker
from hcsd.model import Device, Vendor
from tests.benchmarks.conftest import UUIDS, FakeBlas, nvidia


async def test_measures_the_configured_speed(fake_blas: FakeBlas) -> None:
    result = await run_worker(nvidia(0), fake_blas.request(duration=0.4), timeout=30)
    # sleeps only ever run late (on a loaded machine, by milliseconds): the figure is at most
    # the configured one and near it; a factor wrong in the formula lands outside
    assert 0.6 * 40 <= result["tflops"] <= 40.4
    assert 0.6 * 500 <= result["bandwidth_gbps"] <= 505
    assert result["library"] == "libcublas.so.12" and result["size"] == 4096
    first, count = fake_blas.calls()
    # the arguments cuBLAS got: column-major A·B, FP16 in and out, FP32 accumulate (68),
    # the default algorithm, leading dimensions as stored
    assert first == (
        "gemm transa=0 transb=0 m=4096 n=4096 k=4096 types=2,2,2 lda=4096 ldb=4096 ldc=4096 "
        "compute=68 algo=-1"
    )
    # warm-up calls for 0.05 s (3.4 ms each at 40 TFLOPS: at most 15, as sleeps only run
    # late), the sizing call, then the timed ones
    warm_up = int(count.removeprefix("gemms=")) - 1 - result["iterations"]
    assert 2 <= warm_up <= 15


async def test_fp16_accumulate_passes_half_scalars(fake_blas: FakeBlas) -> None:
    result = await run_worker(nvidia(0), fake_blas.request(compute="fp16"), timeout=30)
    assert result["tflops"] > 0
    assert "compute=64" in fake_blas.calls()[0]  # CUBLAS_COMPUTE_16F; alpha/beta checked as halves


async def test_the_worker_sees_only_its_device(
    fake_blas: FakeBlas, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA_VISIBLE_DEVICES is the device's UUID: the fake driver names the usage it publishes
    after it, so the buffers were allocated on that GPU."""
    state = tmp_path / "gpu-state"
    state.mkdir()
    monkeypatch.setenv("FAKE_GPU_STATE", str(state))
    monkeypatch.setenv("FAKE_CUBLAS_TFLOPS", "0.0005")  # long enough to look while it runs
    everything = str(3 * 512 * 512 * 2 + 2 * (1 << 30))  # A, B, C and the copy buffers
    seen: list[str] = []

    def look() -> str | None:
        seen[:] = [f.read_text() for f in state.iterdir() if not f.name.endswith(".tmp")]
        return "all allocated" if seen and seen[0].split()[-1] == everything else None

    with pytest.raises(Interrupted):
        await run_worker(nvidia(1), fake_blas.request(size=512), timeout=30, interrupt=look)
    assert seen[0].split() == [UUIDS[1], everything]


@pytest.mark.parametrize(
    ("environment", "library_dir", "error", "permanent"),
    [
        pytest.param(
            {"FAKE_CUBLAS_STATUS": "13"},
            "",
            "cublasGemmEx returned CUBLAS_STATUS_EXECUTION_FAILED (13)",
            False,
            id="error-status",
        ),
        pytest.param(
            {}, "nogemm", "libcublas.so.12 has no symbol cublasGemmEx", True, id="missing-symbol"
        ),
    ],
)
async def test_a_failing_library_gives_a_clear_error(
    fake_blas: FakeBlas,
    monkeypatch: pytest.MonkeyPatch,
    environment: dict[str, str],
    library_dir: str,
    error: str,
    permanent: bool,
) -> None:
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    path = (str(fake_blas.build / library_dir), str(fake_blas.build))
    with pytest.raises(BenchmarkError) as raised:
        await run_worker(nvidia(0), fake_blas.request(library_path=path), timeout=30)
    assert str(raised.value) == error
    assert raised.value.permanent is permanent


async def test_a_missing_library_is_permanent(fake_blas: FakeBlas, tmp_path: Path) -> None:
    if ctypes.util.find_library("cublas"):
        pytest.skip("this machine has a real cuBLAS on the loader's path")
    only_driver = tmp_path / "driver"
    only_driver.mkdir()
    (only_driver / "libcuda.so.1").symlink_to(fake_blas.build / "libcuda.so.1")
    request = fake_blas.request(library_path=(str(only_driver),))
    with pytest.raises(BenchmarkError) as raised:
        await run_worker(nvidia(0), request, timeout=30)
    assert str(raised.value).startswith("failed to load libcublas.so.12 or libcublas.so.11: ")
    assert raised.value.permanent


async def test_the_time_limit_kills_the_worker(
    fake_blas: FakeBlas, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CUBLAS_TFLOPS", "0.000001")  # one GEMM: about half an hour
    started = time.monotonic()
    with pytest.raises(BenchmarkError, match=r"^no result within 2s: the worker was killed$"):
        await run_worker(nvidia(0), fake_blas.request(), timeout=2)
    assert time.monotonic() - started < 4


async def test_an_interrupt_stops_the_worker_at_once(
    fake_blas: FakeBlas, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CUBLAS_TFLOPS", "0.000001")
    loop = asyncio.get_running_loop()
    wanted_at = loop.time() + 0.5
    with pytest.raises(Interrupted, match=r"^stopped: ns/pod/main was allocated the device$"):
        await run_worker(
            nvidia(0),
            fake_blas.request(),
            timeout=30,
            interrupt=lambda: (
                "ns/pod/main was allocated the device" if loop.time() >= wanted_at else None
            ),
        )
    assert loop.time() - wanted_at < 0.5


async def test_vendors_without_a_measurement_say_so(fake_blas: FakeBlas) -> None:
    mlu = replace(nvidia(0), vendor=Vendor.CAMBRICON)
    with pytest.raises(BenchmarkError, match=r"^no GEMM measurement for cambricon devices yet$"):
        await run_worker(mlu, fake_blas.request(), timeout=5)


def test_the_fake_refuses_what_cublas_would(fake_blas: FakeBlas) -> None:
    """The fake's checks can fail: no current context, a pointer the driver never handed out,
    a wrong data type, inputs nobody wrote."""
    script = f"""
import ctypes
cuda = ctypes.CDLL("{fake_blas.build / "libcuda.so.1"}")
blas = ctypes.CDLL("{fake_blas.build / "libcublas.so.12"}")
handle = ctypes.c_void_p()
print(blas.cublasCreate_v2(ctypes.byref(handle)))
context = ctypes.c_void_p()
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
assert cuda.cuCtxSetCurrent(context) == 0
assert blas.cublasCreate_v2(ctypes.byref(handle)) == 0
p = ctypes.c_uint64()
size = 64 * 64 * 2
assert cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size)) == 0
a = ctypes.c_void_p(p.value)
one, zero = ctypes.c_float(1), ctypes.c_float(0)
def gemm(A, atype):
    return blas.cublasGemmEx(handle, 0, 0, 64, 64, 64, ctypes.byref(one), A, atype, 64, a, 2,
                             64, ctypes.byref(zero), a, 2, 64, 68, -1)
unwritten = gemm(a, 2)
data = ctypes.create_string_buffer(size // 2)
assert cuda.cuMemcpyHtoD_v2(p, data, ctypes.c_size_t(size // 2)) == 0
half = gemm(a, 2)
rest = ctypes.c_uint64(p.value + size // 2)
assert cuda.cuMemcpyDtoD_v2(rest, p, ctypes.c_size_t(size // 2)) == 0
print(unwritten, half, gemm(a, 2), gemm(ctypes.c_void_p(0x1234), 2), gemm(a, 0))
"""
    env = {**os.environ, "FAKE_CUBLAS_TFLOPS": "0"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    # CUBLAS_STATUS_NOT_INITIALIZED without a context; CUBLAS_STATUS_INVALID_VALUE otherwise
    assert done.stdout.split() == ["1", "7", "7", "0", "7", "7"]
    assert "cublasCreate_v2: no current context" in done.stderr
    assert "was never written (copied in) before the GEMM" in done.stderr
    assert "A=0x1234 is not a device allocation" in done.stderr
    assert "A, B and C must be CUDA_R_16F" in done.stderr


async def test_hygon_through_rocblas(
    fake_blas: FakeBlas, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DCU path: rocblas_gemm_ex over the HIP runtime (tests/fakes/fake_rocblas.c and
    fake_hip.c), D written over C, the DCU shown to the worker by HIP_VISIBLE_DEVICES."""
    log = tmp_path / "rocblas.log"
    monkeypatch.setenv("FAKE_ROCBLAS_LOG", str(log))
    monkeypatch.setenv("FAKE_ROCBLAS_TFLOPS", "30")
    monkeypatch.setenv("FAKE_HIP_COPY_GBPS", "400")
    dcu = replace(nvidia(2), vendor=Vendor.HYGON, model="K100-AI", uuid="hygon-2")
    result = await run_worker(dcu, fake_blas.request(vendor="hygon"), timeout=30)
    assert 0.6 * 30 <= result["tflops"] <= 30.3 and 0.6 * 400 <= result["bandwidth_gbps"] <= 404
    assert result["library"] == "librocblas.so"
    assert log.read_text().splitlines() == [
        "gemm m=4096 n=4096 k=4096 types=150,150,150,150 lds=4096,4096,4096,4096 compute=151 "
        "inplace=1"
    ]
    monkeypatch.setenv("FAKE_ROCBLAS_STATUS", "5")
    with pytest.raises(
        BenchmarkError, match=r"^rocblas_gemm_ex returned rocblas_status_memory_error \(5\)$"
    ):
        await run_worker(dcu, fake_blas.request(vendor="hygon"), timeout=30)


async def test_ascend_through_aclblas(
    fake_blas: FakeBlas, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The NPU path: aclblasGemmEx on a stream of AscendCL (tests/fakes/fake_acl_cblas.c and
    fake_ascendcl.c): FP16 in, FP32 C, reserved leading dimensions, the op model directory."""
    log = tmp_path / "aclblas.log"
    monkeypatch.setenv("FAKE_ACL_LOG", str(log))
    monkeypatch.setenv("FAKE_ACL_TFLOPS", "60")
    monkeypatch.setenv("FAKE_ACL_COPY_GBPS", "700")
    monkeypatch.setenv("FAKE_ACL_REQUIRE_OP_MODELS", "1")
    npu = replace(nvidia(3), vendor=Vendor.ASCEND, model="910B3", uuid="npu-3")
    models = str(tmp_path / "op_models")
    result = await run_worker(
        npu, fake_blas.request(vendor="ascend", ascend_op_models=models), timeout=30
    )
    assert 0.6 * 60 <= result["tflops"] <= 60.6 and 0.6 * 700 <= result["bandwidth_gbps"] <= 707
    assert result["library"] == "libacl_cblas.so"
    assert log.read_text().splitlines() == [
        f"gemm trans=0,0,0 m=4096 n=4096 k=4096 lds=-1,-1,-1 types=1,1,0 compute=0 models={models}"
    ]
    # without a compiled GEMM model CANN answers ACL_ERROR_OP_NOT_FOUND: a setting to fix
    with pytest.raises(BenchmarkError) as raised:
        await run_worker(npu, fake_blas.request(vendor="ascend"), timeout=30)
    assert str(raised.value) == (
        "aclblasGemmEx returned ACL_ERROR_OP_NOT_FOUND (100024): no compiled GEMM "
        "single-operator model for 4096x4096x4096 (measure.ascend_op_models is empty); "
        "compile one with ATC (docs/discovery.md)"
    )
    assert raised.value.permanent


@pytest.mark.parametrize(
    ("device", "request_fields"),
    [
        pytest.param(replace(nvidia(1), pci_bus_id="0000:99:00.0"), {}, id="cuda-another-bus"),
        pytest.param(
            replace(nvidia(2), vendor=Vendor.HYGON, uuid="hygon-2", pci_bus_id="0000:99:00.0"),
            {"vendor": "hygon"},
            id="hip-index-is-another-dcu",
        ),
    ],
)
async def test_a_worker_on_another_device_fails_permanently(
    fake_blas: FakeBlas, device: Device, request_fields: dict[str, object]
) -> None:
    """The runtime's numbering is not the discovery's (a KFD index against HIP's order): the
    worker compares the bus id its runtime reports with the one discovery found, before it
    allocates anything."""
    with pytest.raises(BenchmarkError) as raised:  # WrongDevice in the worker
        await run_worker(device, fake_blas.request(**request_fields), timeout=30)
    assert raised.value.permanent
    assert str(raised.value).endswith(", not at 0000:99:00.0")
    assert "the runtime's device is at 0000:" in str(raised.value)
    assert fake_blas.calls() == []  # no GEMM ran


def test_bus_ids_compare_across_spellings() -> None:
    assert same_bus("00000000:3B:00.0", "0000:3b:00.0")
    assert not same_bus("0000:3b:00.0", "0000:3b:00.1") and not same_bus("", "")
    with pytest.raises(WrongDevice, match=r"^the runtime shows 2 devices, expected exactly 1$"):
        check_device(2, "0000:3b:00.0", "0000:3b:00.0")
    check_device(1, None, "0000:3b:00.0")  # a runtime that reports no bus id (AscendCL)


async def test_the_worker_gets_a_minimal_environment_and_its_group_is_killed(
    fake_blas: FakeBlas, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing of hcsd's own environment reaches the worker (NOTIFY_SOCKET, WATCHDOG_*,
    PYTHONPATH), only what worker_env names; it runs isolated (-I); at the time limit its whole
    process group goes, a child it started included."""
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("WATCHDOG_USEC", "20000000")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.setenv("ASCEND_OPP_PATH", "/usr/local/Ascend/opp")
    seen = tmp_path / "seen"
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        f'env > "{seen}.env"\n'
        f'echo "$@" > "{seen}.args"\n'
        f'sleep 300 & echo $! > "{seen}.child"\n'
        "wait\n"
    )
    python.chmod(0o755)
    with pytest.raises(BenchmarkError, match="no result within 1s"):
        await run_worker(
            nvidia(0),
            fake_blas.request(),
            timeout=1,
            python=str(python),
            worker_env=("PATH", "ASCEND_*", "EXTRA=1"),
        )
    env = dict(line.split("=", 1) for line in (tmp_path / "seen.env").read_text().splitlines())
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "PYTHONPATH", "FAKE_CUBLAS_TFLOPS"):
        assert name not in env
    assert env["ASCEND_OPP_PATH"] == "/usr/local/Ascend/opp" and env["EXTRA"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == UUIDS[0] and env["HCS_WORKER_PARENT"] == str(os.getpid())
    assert (tmp_path / "seen.args").read_text().startswith("-I -m hcsd.benchmarks.worker ")
    child = int((tmp_path / "seen.child").read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # killed with the group; reaped by init
    assert (
        not Path(f"/proc/{child}").exists()
        or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
    )


def test_the_worker_dies_with_its_parent(fake_blas: FakeBlas, tmp_path: Path) -> None:
    """A parent that ends without killing it (hcsd crashing) takes the worker with it
    (PR_SET_PDEATHSIG): no worker is left holding a device."""
    request = fake_blas.request(size=512, duration=20)  # ends by itself if it ever survives
    script = f"""
import os, subprocess, sys, time
env = {{**os.environ, "HCS_WORKER_PARENT": str(os.getpid()), "FAKE_CUBLAS_TFLOPS": "0.01",
       "CUDA_VISIBLE_DEVICES": "{UUIDS[0]}"}}
worker = subprocess.Popen([sys.executable, "-I", "-m", "hcsd.benchmarks.worker", sys.argv[1]],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(worker.pid, flush=True)
time.sleep(1)
os._exit(0)
"""
    done = subprocess.run(
        [sys.executable, "-c", script, request.to_json()],
        capture_output=True,
        text=True,
        check=True,
    )
    worker = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{worker}/stat")
        if not stat.exists() or stat.read_text().split()[2] == "Z":
            return
        time.sleep(0.05)
    raise AssertionError("the worker outlived its parent")
