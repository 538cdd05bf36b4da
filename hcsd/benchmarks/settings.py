"""`[measure]`: when hcsd measures its devices' FP16 throughput, how long, and where the
vendors' math libraries are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hcsd.benchmarks.environment import DEFAULT_WORKER_ENV, check_entry
from hcsd.sections import Section, checks, setting

__all__ = ["DEFAULT_LIBRARY_PATH", "MeasureSection"]

#: Where the vendors' toolkits put their math libraries; hcsd runs without LD_LIBRARY_PATH.
DEFAULT_LIBRARY_PATH = (
    "/usr/local/cuda/lib64",
    "/opt/dtk/lib",
    "/opt/rocm/lib",
    "/usr/local/Ascend/ascend-toolkit/latest/lib64",
    "/usr/local/neuware/lib64",
)


def _interval(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError
    return float(value)


seconds_or_zero = checks.Check("a number of seconds, 0 to disable", _interval)


def _size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 64 <= value <= 32768:
        raise ValueError
    return value


def _mib(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 16384:
        raise ValueError
    return value


def _env_entries(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError
    return tuple(check_entry(v) for v in value)


@dataclass(frozen=True, slots=True)
class MeasureSection(Section):
    """The measured fingerprint: a dense FP16 GEMM per device through the vendor's library."""

    at_start: bool = setting(
        True,
        "Measure every device that holds no allocation once when hcsd starts.",
        checks.boolean,
    )
    interval: float = setting(
        86400.0,
        "Seconds between scheduled measurements of a device (only while it is idle); 0 = "
        "only at start and on demand (hcsctl measure).",
        seconds_or_zero,
    )
    idle_for: float = setting(
        300.0,
        "A scheduled measurement waits until the device has held no allocation for this "
        "long (checked every check_interval).",
        checks.seconds,
    )
    check_interval: float = setting(
        30.0, "Seconds between the schedule's looks at the devices.", checks.seconds
    )
    duration: float = setting(
        3.0,
        "Seconds of timed GEMMs per device, right after the warm-up: the sustained rate over a "
        "few seconds, not a long soak.",
        checks.seconds,
    )
    warmup: float = setting(
        0.5,
        "Seconds of untimed GEMMs first (at least one), so clocks and power have ramped.",
        seconds_or_zero,
    )
    timeout: float = setting(
        60.0,
        "Hard limit per device, library start-up included: past it the measuring process is "
        "killed and no figure is recorded.",
        checks.seconds,
    )
    size: int = setting(
        8192,
        "M = N = K of the GEMM (FP16 inputs; 3 matrices of size*size*2 bytes on the device).",
        checks.Check("an integer in [64, 32768]", _size),
    )
    accumulate: str = setting(
        "fp32",
        "Accumulate in fp32 (the datasheets' dense FP16 tensor figure) or fp16.",
        checks.choice("fp32", "fp16"),
    )
    copy_mib: int = setting(
        256,
        "MiB copied device-to-device to measure memory bandwidth; 0 = no bandwidth figure.",
        checks.Check("an integer in [0, 16384]", _mib),
    )
    file: str = setting(
        "",
        "The measured-figures file; empty = measured.json in daemon.state_dir.",
        checks.path_or_empty,
    )
    ascend_op_models: str = setting(
        "",
        "Ascend: the directory of compiled GEMM single-operator models (ATC) that "
        "aclblasGemmEx runs; empty = none, and Ascend devices fail with ACL_ERROR_OP_NOT_FOUND "
        "(docs/discovery.md says how to compile one).",
        checks.path_or_empty,
    )
    worker_env: tuple[str, ...] = setting(
        DEFAULT_WORKER_ENV,
        "The measuring process's environment beyond PATH and LANG: NAME passes hcsd's "
        "variable, PREFIX* every variable starting so, NAME=value sets one (for what the "
        "vendor toolkit's set_env.sh exports); nothing else of hcsd's is passed.",
        checks.Check("a list of NAME, PREFIX* or NAME=value", _env_entries),
    )
    library_path: tuple[str, ...] = setting(
        DEFAULT_LIBRARY_PATH,
        "Directories searched for the vendors' math libraries (libcublas, librocblas, "
        "libacl_cblas) before the loader's path.",
        checks.path_list,
    )

    def __post_init__(self) -> None:
        Section.__post_init__(self)
        # the time limit covers library start-up, the warm-up, the GEMMs and the copy (a
        # quarter of `duration`): with less, every measurement would be killed
        if self.timeout <= self.warmup + self.duration * 1.25:
            raise ValueError(
                f"timeout: {self.timeout:g}s leaves no time for warmup + duration "
                f"({self.warmup:g}s + {self.duration:g}s and the copy); raise it"
            )
