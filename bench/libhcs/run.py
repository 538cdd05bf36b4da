"""libhcs benchmarks: added cost of a hooked alloc+free pair, and accounting accuracy.

Both run over the fake CUDA driver of libhcs/tests (no GPU here). Overhead: median ns per
pair over 9 rounds of 200,000 pairs, hooked (libhcs preloaded) vs unhooked (same binary, no
preload), plus callgrind instruction counts per pair (total at N pairs minus total at 0 pairs,
divided by N). Hooked is measured twice: a bare process (HCS_VRAM_QUOTA, a process-private
region) and a container's shared region (HCS_CONFIG, the region file mapped MAP_SHARED as in
a container). Target: < 100 ns added per pair. Accuracy: a replayed
PyTorch-caching-allocator-like trace with VMM and async calls; tracked usage must equal the
true sum at every step. Run outside an HCS container: inside one, libhcs takes the
container's quota and ignores these settings.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBHCS = ROOT / "libhcs"
BUILD = LIBHCS / "build"
FAKES = BUILD / "tests" / "fakes"
OUT = ROOT / "bench" / "out"
HERE = Path(__file__).resolve().parent


def build() -> dict[str, Path]:
    subprocess.run(["make", "-s", "-C", str(LIBHCS), "all"], check=True)
    subprocess.run(
        ["make", "-s", "-C", str(LIBHCS / "tests"), f"{BUILD}/tests/fakes/libcuda.so.1"], check=True
    )
    programs = {}
    for name in ("overhead", "replay"):
        target = BUILD / "bench" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["cc", "-O2", "-o", str(target), str(HERE / f"{name}.c"), f"-L{FAKES}", "-lcuda"],
            check=True,
        )
        programs[name] = target
    return programs


CONTAINER_QUOTA = Path("/run/hcs/quota.conf")
SHARED_CONFIG = "version=1\ncontainer=bench\ndevices=1\ndevice.0.uuid=GPU-bench\n" + (
    "device.0.vendor=nvidia\ndevice.0.vram_limit={limit}\n"
)


def run(
    program: Path,
    *args: str,
    hooked: bool,
    quota: str = "64Gi",
    shared: Path | None = None,
    tool: list[str] | None = None,
) -> str:
    """Run a bench program over the fakes; hooked with a bare quota, or a shared region's."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(FAKES))
    for name in ("LD_PRELOAD", "HCS_CONFIG", "HCS_VRAM_QUOTA"):
        env.pop(name, None)
    if hooked:
        env["LD_PRELOAD"] = str(BUILD / "libhcs.so")
        if shared:
            env["HCS_CONFIG"] = str(shared)
        else:
            env["HCS_VRAM_QUOTA"] = quota
    result = subprocess.run(
        [*(tool or []), str(program), *args], env=env, capture_output=True, text=True, check=True
    )
    return result.stdout + result.stderr


def instructions(program: Path, pairs: int, hooked: bool, shared: Path | None = None) -> int:
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "callgrind.out"
        run(
            program,
            str(pairs),
            "1",
            hooked=hooked,
            shared=shared,
            tool=["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"],
        )
        match = re.search(r"^summary:\s+(\d+)", out.read_text(), re.MULTILINE)
        assert match, "no callgrind summary"
        return int(match[1])


def shared_quota(directory: Path) -> Path:
    """A container-style quota.conf (64 GiB on device 0); libhcs makes the region beside it."""
    path = directory / "quota.conf"
    path.write_text(SHARED_CONFIG.format(limit=64 << 30))
    return path


def per_pair(program: Path, hooked: bool, shared: Path | None = None) -> float:
    pairs = 20000
    total = instructions(program, pairs, hooked, shared)
    base = instructions(program, 0, hooked, shared)
    return round((total - base) / pairs, 1)


def main() -> dict[str, object]:
    if CONTAINER_QUOTA.exists():
        raise SystemExit(f"{CONTAINER_QUOTA} exists: run the benchmark outside an HCS container")
    programs = build()
    with tempfile.TemporaryDirectory() as directory:
        shared = shared_quota(Path(directory))
        hooked_ns = float(run(programs["overhead"], hooked=True).split()[0])
        shared_ns = float(run(programs["overhead"], hooked=True, shared=shared).split()[0])
        bare_ns = float(run(programs["overhead"], hooked=False).split()[0])
        per_pair_counts = {
            "unhooked": per_pair(programs["overhead"], hooked=False),
            "hooked": per_pair(programs["overhead"], hooked=True),
            "hooked_shared_region": per_pair(programs["overhead"], hooked=True, shared=shared),
        }
    steps, mismatches, peak, refused = run(
        programs["replay"], "200000", hooked=True, quota="40Gi"
    ).split()
    result: dict[str, object] = {
        "benchmark": "libhcs",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "pair_ns_hooked_median": hooked_ns,
        "pair_ns_hooked_shared_region_median": shared_ns,
        "pair_ns_unhooked_median": bare_ns,
        "pair_ns_added": round(hooked_ns - bare_ns, 1),
        "pair_ns_added_shared_region": round(shared_ns - bare_ns, 1),
        "instructions_per_pair": per_pair_counts,
        "instructions_added_per_pair": round(
            per_pair_counts["hooked"] - per_pair_counts["unhooked"], 1
        ),
        "instructions_added_per_pair_shared_region": round(
            per_pair_counts["hooked_shared_region"] - per_pair_counts["unhooked"], 1
        ),
        "replay_steps": int(steps),
        "replay_mismatches": int(mismatches),
        "replay_peak_live_bytes": int(peak),
        "replay_refused_at_quota": int(refused),
        "target_added_ns": 100,
    }
    result["meets_target"] = result["pair_ns_added"] < 100 and int(mismatches) == 0  # type: ignore[operator]
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "libhcs.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"libhcs alloc+free pair over the fake driver: hooked {hooked_ns} ns, unhooked "
        f"{bare_ns} ns (median of 9 x 200k): +{result['pair_ns_added']} ns; callgrind "
        f"{per_pair_counts['hooked']} vs {per_pair_counts['unhooked']} instructions per pair "
        f"(+{result['instructions_added_per_pair']})"
    )
    print(
        f"with a container's shared region: {shared_ns} ns "
        f"(+{result['pair_ns_added_shared_region']} ns), "
        f"{per_pair_counts['hooked_shared_region']} instructions per pair "
        f"(+{result['instructions_added_per_pair_shared_region']})"
    )
    print(
        f"accounting replay: {steps} steps (PyTorch-like sizes, VMM, async), {mismatches} "
        f"mismatches, peak {int(peak) / 2**30:.1f} GiB live, {refused} refused at the 40Gi "
        f"quota -> {path}"
    )
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["meets_target"] else 1)
