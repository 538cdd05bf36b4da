"""The GEMM measurement against the fake vendor math libraries (tests/fakes/fake_cublas.c over
fake_cuda.c): they follow cuBLAS's and the driver's ABI, refuse arguments a real library would
(and pointers the driver never handed out), and take the time the configured speed gives, so
the measured TFLOPS is known in advance."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from hcsd.benchmarks import environment
from hcsd.benchmarks.request import GemmRequest
from hcsd.model import Device, Vendor

GiB = 2**30
#: The worker's environment in these tests: the defaults and the fakes' settings.
WORKER_ENV = (*environment.DEFAULT_WORKER_ENV, "FAKE_*")
UUIDS = [f"GPU-00000000-0000-0000-0000-{i:012x}" for i in range(4)]


@dataclass
class FakeBlas:
    build: Path
    log: Path

    def request(self, **fields: object) -> GemmRequest:
        """A short measurement that finds the fakes first. The GEMMs and copies are big enough
        (milliseconds each at the fakes' speeds) that a loaded machine's slow Python, which
        launches them, does not show in the figure: the fakes touch no memory."""
        values: dict[str, object] = {
            "vendor": "nvidia",
            "size": 4096,
            "duration": 0.2,
            "warmup": 0.05,
            "copy_bytes": 1 << 30,
            "library_path": (str(self.build),),
        }
        values.update(fields)
        return GemmRequest(**values)  # type: ignore[arg-type]

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
def fake_blas(fake_libs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeBlas:
    """The fakes' settings in this process's environment, which the worker inherits."""
    log = tmp_path / "cublas.log"
    monkeypatch.setenv("FAKE_CUBLAS_LOG", str(log))
    monkeypatch.setenv("FAKE_CUBLAS_TFLOPS", "40")
    monkeypatch.setenv("FAKE_CUDA_COPY_GBPS", "500")
    monkeypatch.delenv("FAKE_CUBLAS_STATUS", raising=False)
    # the worker gets only what worker_env names: the fakes' settings too, for these tests
    monkeypatch.setattr(environment, "DEFAULT_WORKER_ENV", WORKER_ENV)
    # the bus ids the fake runtimes report: CUDA by UUID, HIP by index, as discovery found them
    # (in the runtimes' own spelling: 4-digit domain, upper case)
    buses = [nvidia(i).pci_bus_id.upper() for i in range(len(UUIDS))]
    monkeypatch.setenv("FAKE_CUDA_BUS_IDS", ",".join(f"{u}={b}" for u, b in zip(UUIDS, buses)))
    monkeypatch.setenv("FAKE_HIP_BUS_IDS", ",".join(f"{i}={b}" for i, b in enumerate(buses)))
    return FakeBlas(fake_libs, log)


def nvidia(index: int, model: str = "A100-SXM4-80GB") -> Device:
    return Device(
        uuid=UUIDS[index],
        vendor=Vendor.NVIDIA,
        model=model,
        index=index,
        pci_bus_id=f"0000:{0x17 + 0x10 * index:02x}:00.0",
        vram_bytes=80 * GiB,
        tflops_fp16=312.0,
    )
