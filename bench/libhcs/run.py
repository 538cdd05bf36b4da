"""libhcs benchmarks: added cost of a hooked alloc+free pair, and accounting accuracy.

Both run over the fake CUDA driver of libhcs/tests (no GPU here). Overhead: median ns per
pair over 9 rounds of 200,000 pairs, hooked (libhcs preloaded, quota set) vs unhooked (same
binary, no preload), plus callgrind instruction counts per pair (total at N pairs minus total
at 0 pairs, divided by N) for both. Target: < 100 ns added per pair. Accuracy: a replayed
PyTorch-caching-allocator-like trace with VMM and async calls; tracked usage must equal the
true sum at every step.
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


def run(
    program: Path, *args: str, hooked: bool, quota: str = "64Gi", tool: list[str] | None = None
) -> str:
    env = dict(os.environ, LD_LIBRARY_PATH=str(FAKES))
    env.pop("LD_PRELOAD", None)
    if hooked:
        env["LD_PRELOAD"] = str(BUILD / "libhcs.so")
        env["HCS_VRAM_QUOTA"] = quota
    result = subprocess.run(
        [*(tool or []), str(program), *args], env=env, capture_output=True, text=True, check=True
    )
    return result.stdout + result.stderr


def instructions(program: Path, pairs: int, hooked: bool) -> int:
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "callgrind.out"
        run(
            program,
            str(pairs),
            "1",
            hooked=hooked,
            tool=["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"],
        )
        match = re.search(r"^summary:\s+(\d+)", out.read_text(), re.MULTILINE)
        assert match, "no callgrind summary"
        return int(match[1])


def main() -> dict[str, object]:
    programs = build()
    hooked_ns = float(run(programs["overhead"], hooked=True).split()[0])
    bare_ns = float(run(programs["overhead"], hooked=False).split()[0])
    pairs = 20000
    per_pair = {}
    for hooked in (False, True):
        total = instructions(programs["overhead"], pairs, hooked)
        base = instructions(programs["overhead"], 0, hooked)
        per_pair["hooked" if hooked else "unhooked"] = round((total - base) / pairs, 1)
    steps, mismatches, peak, refused = run(
        programs["replay"], "200000", hooked=True, quota="40Gi"
    ).split()
    result: dict[str, object] = {
        "benchmark": "libhcs",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "pair_ns_hooked_median": hooked_ns,
        "pair_ns_unhooked_median": bare_ns,
        "pair_ns_added": round(hooked_ns - bare_ns, 1),
        "instructions_per_pair": per_pair,
        "instructions_added_per_pair": round(per_pair["hooked"] - per_pair["unhooked"], 1),
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
        f"{per_pair['hooked']} vs {per_pair['unhooked']} instructions per pair "
        f"(+{result['instructions_added_per_pair']})"
    )
    print(
        f"accounting replay: {steps} steps (PyTorch-like sizes, VMM, async), {mismatches} "
        f"mismatches, peak {int(peak) / 2**30:.1f} GiB live, {refused} refused at the 40Gi "
        f"quota -> {path}"
    )
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["meets_target"] else 1)
