"""Helpers shared by the benchmarks: start hcsd on the simulated node, write results."""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def summary_us(seconds: list[float]) -> dict[str, float]:
    micro = [s * 1e6 for s in seconds]
    return {
        "n": len(micro),
        "p50_us": round(statistics.median(micro), 1),
        "p90_us": round(percentile(micro, 0.90), 1),
        "p99_us": round(percentile(micro, 0.99), 1),
        "max_us": round(max(micro), 1),
    }


def write_result(name: str, data: dict[str, Any]) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    data = {
        "benchmark": name,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **data,
    }
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


class SimulatedDaemon:
    """hcsd in a temporary directory on the simulated mixed node."""

    def __init__(
        self,
        extra_env: dict[str, str] | None = None,
        config_extra: str = '[health]\nsource = "off"\n',
        *,
        nri: bool = False,
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hcs-bench-"))
        self.socket = str(self.dir / "hcsd.sock")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        config = self.dir / "hcsd.toml"
        config.write_text(
            f'[daemon]\nsocket = "{self.socket}"\nstate_dir = "{self.dir}/state"\n'
            f'run_dir = "{self.dir}"\n[metrics]\nlisten = "127.0.0.1:{port}"\n'
            f'[runtime]\nnri = {"true" if nri else "false"}\ncdi_dir = "{self.dir}/cdi"\n'
            f'nri_socket = "{self.dir}/nri.sock"\nnri_prelaunch_socket = "{self.dir}/pre.sock"\n'
            f'[discovery]\nsimulated_node = "{ROOT}/examples/nodes/mixed.toml"\n' + config_extra
        )
        env = dict(os.environ, **(extra_env or {}))
        env["PYTHONPATH"] = str(ROOT)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hcsd.daemon.lifecycle", "--config", str(config)],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while not os.path.exists(self.socket):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("hcsd did not start")
            time.sleep(0.02)
        time.sleep(0.2)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=15)
        shutil.rmtree(self.dir, ignore_errors=True)
