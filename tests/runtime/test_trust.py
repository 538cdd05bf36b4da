"""The node's trust boundaries against a real containerd 2.3 with runc: hcsd as a required NRI
plugin, a CreateContainer past the runtime's timeout, allocations of other front ends across a
Synchronize, CreateContainer latency as the runtime measures it, and the CDI spec as an
operator interface."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from hcsd.cli.hcsctl import main as hcsctl
from tests.harness.bundles import hcs_runtime, make_bundle
from tests.harness.daemon import Daemon, free_port
from tests.harness.peers.runtimes import Binaries
from tests.harness.waiting import wait_for
from tests.runtime.containerd import Containerd, CrictlError
from tests.runtime.node import GPU0, allocations, runtime_hcsd, start_registered

pytestmark = pytest.mark.slow


def start_hcsd(
    directory: Path, containerd: Containerd, closing: list[Containerd | Daemon]
) -> Daemon:
    """hcsd on the runtime test node, connected to `containerd`'s NRI socket."""
    daemon = runtime_hcsd(directory, containerd.nri_socket)
    closing.append(daemon)
    start_registered(daemon)
    return daemon


def launched(
    binaries: Binaries,
    tmp_path: Path,
    closing: list[Containerd | Daemon],
    *,
    imports: Sequence[Path] = (),
    timeout: str = "2s",
) -> Containerd:
    runtime = Containerd(
        binaries,
        tmp_path / "containerd",
        nri_socket=tmp_path / "nri" / "nri.sock",
        nri_request_timeout=timeout,
        imports=imports,
    )
    closing.append(runtime)
    runtime.launch()
    return runtime


@pytest.fixture
def closing() -> Iterator[list[Containerd | Daemon]]:
    """Close what a test started, hcsd first (its NRI session), then containerd."""
    started: list[Containerd | Daemon] = []
    yield started
    for item in reversed(started):
        item.close()


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text: str = response.read().decode()
    return text


def setup_drop_in(tmp_path: Path) -> Path:
    """What `hcsctl setup containerd --yes` writes on a containerd 2.x node (NRI on)."""
    root = tmp_path / "setup"
    (root / "etc/containerd").mkdir(parents=True)
    (root / "etc/containerd/config.toml").write_text("version = 3\n")
    assert hcsctl(["setup", "containerd", "--root", str(root), "--yes"]) == 0
    return root / "etc/containerd/conf.d/10-hcsd-nri.toml"


def test_with_hcsd_required_containers_wait_for_hcsd(
    runtime_binaries: Binaries,
    busybox_image: Path,
    tmp_path: Path,
    closing: list[Containerd | Daemon],
) -> None:
    """With the validator `hcsctl setup containerd` configures, containerd refuses to create a
    container while hcsd is down, instead of starting it without its devices and quota."""
    containerd = launched(runtime_binaries, tmp_path, closing, imports=[setup_drop_in(tmp_path)])
    pod = containerd.run_pod("trainer", "team-a", "uid-1")  # sandboxes are not validated
    with pytest.raises(CrictlError, match='required plugin "hcsd" not present'):
        containerd.create_container(pod, "early", annotations={"hcs.io/vram": "8Gi"})
    with pytest.raises(CrictlError, match='required plugin "hcsd" not present'):
        containerd.create_container(pod, "plain")  # every container: the price of the setting
    hcsd = start_hcsd(tmp_path / "hcsd", containerd, closing)
    ctr = containerd.create_container(pod, "main", annotations={"hcs.io/vram": "8Gi"})
    env = dict(e.split("=", 1) for e in containerd.runtime_spec(ctr)["process"]["env"])
    assert env["HCS_CONFIG"] == "/run/hcs/quota.conf" and env["CUDA_VISIBLE_DEVICES"] == GPU0
    assert ctr in allocations(hcsd)


def test_the_pod_annotation_requires_hcsd_for_that_pod_only(
    runtime_binaries: Binaries,
    busybox_image: Path,
    tmp_path: Path,
    closing: list[Containerd | Daemon],
) -> None:
    """The alternative to a node-wide requirement: the validator on, no required_plugins,
    and `required-plugins.noderesource.dev` on the pods that need hcsd."""
    validator = tmp_path / "validator.toml"
    validator.write_text(
        "version = 3\n[plugins.'io.containerd.nri.v1.nri'.default_validator]\n  enable = true\n"
    )
    containerd = launched(runtime_binaries, tmp_path, closing, imports=[validator])
    marked = containerd.run_pod(
        "gpu", "team-a", "uid-8", annotations={"required-plugins.noderesource.dev": '["hcsd"]'}
    )
    plain = containerd.run_pod("web", "team-a", "uid-9")
    with pytest.raises(CrictlError, match='required plugin "hcsd" not present'):
        containerd.create_container(marked, "main", annotations={"hcs.io/vram": "8Gi"})
    containerd.create_container(plain, "main")  # not marked: created while hcsd is down


def test_a_container_created_past_the_timeout_is_found_and_released(
    runtime_binaries: Binaries,
    busybox_image: Path,
    tmp_path: Path,
    closing: list[Containerd | Daemon],
) -> None:
    """hcsd stalls past containerd's request timeout: containerd drops the plugin and creates
    the container without hcsd's edits, while hcsd, once it runs again, allocates for it. At
    the Synchronize that follows hcsd's reconnection, hcsd finds the container without its
    edits, releases the allocation, counts and logs it."""
    containerd = launched(runtime_binaries, tmp_path, closing, timeout="1s")
    hcsd = start_hcsd(tmp_path / "hcsd", containerd, closing)
    assert hcsd.process is not None
    wait_for(lambda: "nri: synchronized" in hcsd.logs(), "the first session's Synchronize")
    synchronized = hcsd.logs().count("nri: synchronized")
    pod = containerd.run_pod("late", "team-e", "uid-5")
    os.kill(hcsd.process.pid, signal.SIGSTOP)
    try:
        ctr = containerd.create_container(
            pod, "main", command=["sleep", "300"], annotations={"hcs.io/vram": "4Gi"}
        )
    finally:
        os.kill(hcsd.process.pid, signal.SIGCONT)
    env = dict(e.split("=", 1) for e in containerd.runtime_spec(ctr)["process"]["env"])
    assert "HCS_CONFIG" not in env  # created without hcsd: no devices, no quota
    containerd.start(ctr)
    wait_for(lambda: hcsd.logs().count("nri: registered") >= 2, "hcsd registered again")
    wait_for(  # the second session's Synchronize, not the first one's line again
        lambda: hcsd.logs().count("nri: synchronized") > synchronized,
        "Synchronize after reconnecting",
    )
    logs = hcsd.logs()
    assert (
        "team-e/late/main: asked for devices but runs without hcsd's devices and quota" in logs
    ), logs
    assert ctr not in allocations(hcsd)
    assert "hcs_uninjected_containers_total 1" in metrics(hcsd.port)
    assert not (hcsd.dir / "containers" / ctr).exists()


def runc_wrapper(daemon: Daemon, root: Path, *args: str) -> int:
    """hcs-runtime with its stdio away from pipes (a created container keeps them open)."""
    with open(root / "hcs-runtime.log", "a") as log:
        return hcs_runtime(
            daemon, root, *args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log
        ).returncode


def test_an_hcs_runtime_allocation_survives_an_nri_synchronize(
    runtime_binaries: Binaries,
    busybox_image: Path,
    tmp_path: Path,
    closing: list[Containerd | Daemon],
) -> None:
    """A container hcs-runtime started (another runtime on the node) is not in containerd's
    list; containerd's Synchronize must not release its allocation nor remove its files."""
    containerd = launched(runtime_binaries, tmp_path, closing)
    hcsd = start_hcsd(tmp_path / "hcsd", containerd, closing)
    work = tmp_path / "wrapper"
    work.mkdir()
    bundle = make_bundle(work, {"hcs.io/vram": "2Gi"}, "sleep 300")
    assert runc_wrapper(hcsd, work, "create", "--bundle", str(bundle), "wrapped") == 0, (
        work / "hcs-runtime.log"
    ).read_text()
    try:
        assert "wrapped" in allocations(hcsd)
        containerd.restart()
        wait_for(lambda: hcsd.logs().count("nri: synchronized") >= 2, "Synchronize again")
        assert "wrapped" in allocations(hcsd), hcsd.logs()
        assert allocations(hcsd)["wrapped"]["front_end"] == "hcs-runtime"
        assert (hcsd.dir / "containers" / "wrapped" / "quota.conf").is_file()
    finally:
        runc_wrapper(hcsd, work, "delete", "--force", "wrapped")
    assert "wrapped" not in allocations(hcsd)


def nri_latency(text: str, operation: str) -> tuple[dict[float, float], float, float]:
    """containerd's histogram of hcsd's answers: (bucket bound -> count, sum, count)."""
    name = "containerd_nri_plugin_latency_seconds"
    labels = f'operation="{operation}",plugin="10-hcsd"'
    buckets: dict[float, float] = {}
    total = count = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or labels not in line.replace(" ", ""):
            continue
        value = float(line.rsplit(" ", 1)[1])
        if line.startswith(f"{name}_bucket"):
            bound = re.search(r'le="([^"]+)"', line)
            assert bound is not None
            buckets[math.inf if bound.group(1) == "+Inf" else float(bound.group(1))] = value
        elif line.startswith(f"{name}_sum"):
            total = value
        elif line.startswith(f"{name}_count"):
            count = value
    return buckets, total, count


def test_create_container_answers_well_inside_the_runtime_timeout(
    runtime_binaries: Binaries,
    busybox_image: Path,
    tmp_path: Path,
    closing: list[Containerd | Daemon],
) -> None:
    """CreateContainer as containerd times it (its own NRI latency histogram), each one an
    fsync'd ledger write plus the quota file: all answers within 1 s of the 2 s timeout."""
    port = free_port()
    metrics_config = tmp_path / "metrics.toml"
    metrics_config.write_text(f'version = 3\n[metrics]\n  address = "127.0.0.1:{port}"\n')
    containerd = launched(runtime_binaries, tmp_path, closing, imports=[metrics_config])
    hcsd = start_hcsd(tmp_path / "hcsd", containerd, closing)
    pod = containerd.run_pod("bench", "team-f", "uid-6")
    created = 20
    for i in range(created):
        containerd.create_container(pod, f"c{i}", annotations={"hcs.io/vram": "1Gi"})
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/metrics", timeout=10) as reply:
        buckets, total, count = nri_latency(reply.read().decode(), "CreateContainer")
    assert count == created and len(allocations(hcsd)) == created, buckets
    assert buckets[1.0] == count  # every answer within 1 s
    within = {bound: n for bound, n in sorted(buckets.items()) if n}
    print(
        f"\nNRI CreateContainer through containerd: {created} calls, mean "
        f"{total / count * 1000:.1f} ms; cumulative buckets {json.dumps(within)}",
        file=sys.stderr,
    )


def test_the_root_only_cdi_spec_serves_the_operator_with_libhcs(
    runtime_binaries: Binaries,
    busybox_image: Path,
    tmp_path: Path,
    closing: list[Containerd | Daemon],
) -> None:
    """containerd (root) still reads hcsd's 0600 CDI spec: a container that names
    `hcs.io/device=nvidia-0` gets the device with libhcs and hcsd's preload mounted."""
    cdi_dir = tmp_path / "hcsd" / "cdi"
    cdi_config = tmp_path / "cdi.toml"
    cdi_config.write_text(
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n"
        f'  enable_cdi = true\n  cdi_spec_dirs = ["{cdi_dir}"]\n'
    )
    containerd = launched(runtime_binaries, tmp_path, closing, imports=[cdi_config])
    hcsd = start_hcsd(tmp_path / "hcsd", containerd, closing)
    spec_file = cdi_dir / "hcs.io-device.yaml"
    assert spec_file.stat().st_mode & 0o777 == 0o600
    pod = containerd.run_pod("ops", "ops", "uid-7")
    ctr = containerd.create_container(
        pod,
        "diag",
        command=["sh", "-c", "stat -c 'node %t %T' /dev/nvidia0; cat /etc/ld.so.preload"],
        annotations={"cdi.k8s.io/hcs": "hcs.io/device=nvidia-0"},
    )
    spec = containerd.runtime_spec(ctr)
    mounts = {m["destination"]: m for m in spec["mounts"]}
    assert mounts["/etc/ld.so.preload"]["source"] == str(hcsd.dir / "ld.so.preload")
    assert "/usr/lib/hcs/libhcs.so" in mounts
    containerd.start(ctr)
    wait_for(lambda: "libhcs.so" in containerd.logs(ctr), "the container ran")
    assert "node 1 3" in containerd.logs(ctr)
    assert ctr not in allocations(hcsd)  # an operator's whole device: outside the ledger
