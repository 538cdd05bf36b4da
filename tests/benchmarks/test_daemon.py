"""hcsd as a process, its NVIDIA backend over the fake NVML and its measurement over the fake
cuBLAS: measured at start, the figures in `hcsctl devices`, in the file, and back after a
restart; `hcsctl measure` bounded by measure.timeout."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.benchmarks.conftest import UUIDS, WORKER_ENV, FakeBlas
from tests.fakes.nodes import nvidia_node
from tests.harness.daemon import Daemon

pytestmark = pytest.mark.slow


@pytest.fixture
def hcsd(tmp_path: Path, fake_blas: FakeBlas, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    if os.geteuid() != 0:
        pytest.skip("NOT ROOT: the fake node's device nodes need CAP_MKNOD")
    (tmp_path / "node").mkdir()
    node = nvidia_node(tmp_path / "node", count=2, topology="pcie")
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(node.config))
    daemon = Daemon(
        tmp_path / "hcsd",
        settings={
            "discovery": {
                "backends": ["nvidia"],
                "sysfs": node.sysfs,
                "dev_root": node.dev,
                "nvml_library": fake_blas.build / "libnvidia-ml.so.1",
                "hotplug": False,
            },
            "measure": {
                "size": 4096,
                "duration": 0.2,
                "warmup": 0.05,
                "copy_mib": 1024,
                "timeout": 3,
                "interval": 0,
                "library_path": [str(fake_blas.build)],
                "worker_env": list(WORKER_ENV),
            },
        },
    )
    yield daemon
    daemon.close()


def devices(daemon: Daemon) -> dict[str, dict[str, object]]:
    done = daemon.hcsctl("--json", "devices")
    assert done.returncode == 0, done.stderr
    return {d["uuid"]: d for d in json.loads(done.stdout)}


def wait_measured(daemon: Daemon, count: int) -> dict[str, dict[str, object]]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = devices(daemon)
        if sum(d["attributes"].get("fingerprint") == "measured" for d in found.values()) == count:
            return found
        time.sleep(0.2)
    raise AssertionError(f"not measured: {found}\n{daemon.logs()}")


def test_measured_at_start_kept_across_a_restart(
    hcsd: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    hcsd.start()
    found = wait_measured(hcsd, 2)
    for uuid in UUIDS[:2]:
        attributes = found[uuid]["attributes"]
        raw = float(attributes["measured_tflops_fp16"])  # type: ignore[index]
        assert 24 <= raw <= 40.4  # the fake's 40, not the profile's 312
        assert attributes["measured_ratio"] == f"{raw / 312:.4f}"  # type: ignore[index]
        # rated at the profile scaled by the ratio over the typical 0.7
        rated = float(found[uuid]["tflops_fp16"])  # type: ignore[arg-type]
        assert rated == pytest.approx(raw / 0.7, abs=0.01)
    logs = hcsd.logs()
    assert f"measure: nvidia/0 ({UUIDS[0]}): " in logs and "of the profile's 312)" in logs
    on_file = json.loads((hcsd.dir / "state" / "measured.json").read_text())
    assert sorted(on_file) == UUIDS[:2]
    table = hcsd.hcsctl("devices").stdout.splitlines()
    column = table[0].index("MEASURED")
    assert all(8 <= int(row[column:].split()[0].rstrip("%")) <= 13 for row in table[1:])  # of 312
    assert hcsd.stop() == 0

    # restarted without the start pass, and with a GEMM that would never end: the figures
    # come back from the file at once; a measurement on demand ends at the time limit
    hcsd.configure({"measure": {"at_start": False}})
    monkeypatch.setenv("FAKE_CUBLAS_TFLOPS", "0.000001")
    hcsd.start()
    again = devices(hcsd)
    assert [again[u]["tflops_fp16"] for u in UUIDS[:2]] == [
        found[u]["tflops_fp16"] for u in UUIDS[:2]
    ]
    started = time.monotonic()
    done = hcsd.hcsctl("measure", UUIDS[0])
    assert done.returncode == 1 and time.monotonic() - started < 10
    assert "failed" in done.stdout and "no result within 3s: the worker was killed" in done.stdout
    assert devices(hcsd)[UUIDS[0]]["tflops_fp16"] == found[UUIDS[0]]["tflops_fp16"]
    url = f"http://127.0.0.1:{hcsd.port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        metrics = response.read().decode()
    assert 'hcs_measurements_total{outcome="failed"} 1.0' in metrics
