"""hcsd as a real process: sd_notify, hcsctl against it, metrics, SIGHUP, SIGTERM, restart."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness.daemon import Daemon

pytestmark = pytest.mark.slow


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path)
    yield d
    d.close()


def test_ready_status_and_watchdog(daemon: Daemon) -> None:
    messages = daemon.start(watchdog_usec=200_000)
    ready = next(m for m in messages if "READY=1" in m)
    assert "STATUS=6 devices, 0 allocations" in ready
    daemon.wait_notify("WATCHDOG=1")
    assert daemon.stop() == 0
    daemon.wait_notify("STOPPING=1")
    assert "<6>hcsd 0.1.0 ready on node test-node: 6 device(s)" in daemon.logs()
    assert not os.path.exists(daemon.socket)
    spec = json.loads((daemon.dir / "cdi" / "hcs.io-device.yaml").read_text())
    assert spec["kind"] == "hcs.io/device" and len(spec["devices"]) == 12
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    nodes = {n["path"] for n in by_name["nvidia-1"]["deviceNodes"]}
    assert nodes == {"/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    assert (
        "NVIDIA_VISIBLE_DEVICES=GPU-5b2f0c0e-8d1a-4c11-9d2e-a100a100a001"
        in (by_name["nvidia-1"]["env"])
    )
    assert "nri: cannot connect to" in daemon.logs()  # no runtime here: it keeps retrying


def test_no_accelerators_runs_with_zero_devices_and_says_why(tmp_path: Path) -> None:
    """The packaged default (`auto`) on a node with no accelerator: hcsd starts, reports zero
    devices, and both its log and `hcsctl status` say why, per vendor."""
    sysfs = tmp_path / "sys"
    (sysfs / "bus" / "pci" / "devices").mkdir(parents=True)
    daemon = Daemon(
        tmp_path / "hcsd", settings={"discovery": {"backends": ["auto"], "sysfs": sysfs}}
    )
    try:
        ready = next(m for m in daemon.start() if "READY=1" in m)
        assert "STATUS=0 devices, 0 allocations" in ready
        status = daemon.hcsctl("status")
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        assert "backends:    -" in lines and "devices:     0 (0 not healthy)" in lines
        why = f"on the PCI bus (vendor {{}}, display or accelerator class, in {sysfs})"
        notes = [
            "nvidia: not run, no NVIDIA GPU " + why.format("0x10de"),
            "ascend: not run, no Huawei Ascend NPU " + why.format("0x19e5"),
            "hygon: not run, no Hygon DCU " + why.format("0x1d94"),
            "cambricon: not run, no Cambricon MLU " + why.format("0xcabc"),
        ]
        start = lines.index(f"not found:   {notes[0]}")
        assert lines[start + 1 : start + 4] == [f"             {n}" for n in notes[1:]]
        logs = daemon.logs()
        for note in notes:
            assert f"<6>discovery: {note}" in logs
        assert "ready on node test-node: 0 device(s) from no backend" in logs
    finally:
        daemon.close()


def test_hcsctl_against_the_daemon(daemon: Daemon) -> None:
    daemon.start()
    devices = daemon.hcsctl("devices")
    assert devices.returncode == 0, devices.stderr
    assert len(devices.stdout.splitlines()) == 7 and "A100-SXM4-80GB" in devices.stdout

    allocated = daemon.hcsctl(
        "allocate",
        "--container",
        "job-1",
        "--vram",
        "16Gi",
        "--vendor",
        "nvidia",
        "--pod",
        "team-a/trainer",
    )
    assert allocated.returncode == 0, allocated.stderr
    assert allocated.stdout.startswith("allocated (A100-SXM4-80GB):")

    data = json.loads(daemon.hcsctl("--json", "allocations").stdout)
    assert data[0]["container_id"] == "job-1"
    assert data[0]["pod"] == {"namespace": "team-a", "name": "trainer", "uid": ""}
    assert data[0]["grants"][0]["vram_bytes"] == str(16 * 2**30)

    health = daemon.hcsctl("health")
    assert health.returncode == 0 and health.stdout.count("healthy") == 6
    status = daemon.hcsctl("status")
    assert "vram:        16Gi allocated of 368Gi" in status.stdout

    refused = daemon.hcsctl("allocate", "--container", "job-2", "--vram", "1Ti")
    assert refused.returncode == 1
    assert refused.stderr.startswith("hcsctl: job-2: ") and refused.stderr.count("\n") == 1
    assert refused.stderr.endswith(" (refused: insufficient_vram)\n")

    bad = daemon.hcsctl("allocate", "--container", "job-3", "--vram", "lots")
    assert bad.returncode == 1
    assert bad.stderr.startswith("hcsctl: job-3: invalid request: vram: invalid quantity 'lots'")
    assert bad.stderr.endswith(" (refused: invalid_request)\n")

    released = daemon.hcsctl("release", "job-1")
    assert released.stdout == "released job-1\n"
    assert daemon.hcsctl("release", "job-1").stdout == "job-1 held nothing; nothing to release\n"


def test_hcsctl_without_a_daemon_says_why(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hcsd.cli.hcsctl",
            "--socket",
            str(tmp_path / "none.sock"),
            "devices",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr == (
        f"hcsctl: cannot reach hcsd at {tmp_path}/none.sock: no such socket "
        "(is hcsd running? try: systemctl status hcsd)\n"
    )


def test_metrics_endpoint(daemon: Daemon) -> None:
    daemon.start()
    daemon.hcsctl("allocate", "--container", "m", "--vram", "1Gi")
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/metrics", timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    assert "hcs_allocations 1.0" in text
    assert 'hcs_refusals_total{reason="insufficient_vram"} 0.0' in text
    assert 'hcs_api_request_duration_seconds_count{method="Allocate"} 1.0' in text
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    request = urllib.request.Request(
        f"http://127.0.0.1:{daemon.port}/metrics", headers={"Accept": accept}
    )
    with urllib.request.urlopen(request, timeout=5) as r:  # as Prometheus asks
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        assert r.read().decode().endswith("# EOF\n")
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as s:
        s.sendall(b"POST /metrics HTTP/1.1\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 405")


def closed_by_peer(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except OSError:  # still waiting in the accept queue, or never connected
        return False


def test_a_connection_flood_on_the_metrics_port_costs_few_descriptors(daemon: Daemon) -> None:
    """300 held connections against a 256-descriptor limit: hcsd serves on, logs little.

    hcsd takes 16 at a time (the rest wait in the kernel's accept queue) and closes each after
    the 5 s idle timeout."""
    daemon.start(max_files=256)
    baseline = daemon.open_files()
    log_size = len(daemon.logs())
    flood: list[socket.socket] = []
    most = baseline
    try:
        for _ in range(300):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", daemon.port))  # loopback only; a full queue just waits
            flood.append(s)
            most = max(most, daemon.open_files())
        time.sleep(0.5)
        most = max(most, daemon.open_files())
        status = daemon.hcsctl("status")
        assert status.returncode == 0, status.stderr  # the API still answers
        assert most - baseline <= 20, f"{most - baseline} descriptors for held connections"
        time.sleep(6)  # past the idle timeout: hcsd closed those it took, took the next ones
        assert daemon.open_files() - baseline <= 20
        assert sum(map(closed_by_peer, flood)) >= 16
    finally:
        for s in flood:
            s.close()
    time.sleep(1)
    assert daemon.open_files() <= baseline + 4
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/metrics", timeout=10) as r:
        assert r.status == 200 and "hcs_allocations 0.0" in r.read().decode()
    logged = daemon.logs()[log_size:]
    assert len(logged) < 4096, logged[:2000]
    assert "out of system resource" not in logged and "Too many open files" not in logged


def test_sighup_reloads_and_keeps_running_on_a_bad_file(daemon: Daemon) -> None:
    daemon.start()
    assert daemon.process is not None
    daemon.configure({"allocator": {"policy": "spread"}})
    daemon.process.send_signal(signal.SIGHUP)
    daemon.wait_notify("READY=1")
    # spread: two 1Gi requests land on different A100s
    for name in ("s1", "s2"):
        daemon.hcsctl("allocate", "--container", name, "--vram", "1Gi", "--vendor", "nvidia")
    devices = {
        a["grants"][0]["device_uuid"]
        for a in json.loads(daemon.hcsctl("--json", "allocations").stdout)
    }
    assert len(devices) == 2

    daemon.config.write_text("[allocator\n")
    daemon.process.send_signal(signal.SIGHUP)
    daemon.wait_notify("READY=1")
    assert "reload failed, keeping the running configuration" in daemon.logs()
    assert daemon.hcsctl("status").returncode == 0


def test_sighup_switches_the_node_mode_and_status_shows_it(daemon: Daemon) -> None:
    """A node joins a cluster without a restart (which would hold up, with hcsd a required NRI
    plugin, every container creation meanwhile)."""
    daemon.start()
    assert daemon.process is not None
    assert "mode:        standalone" in daemon.hcsctl("status").stdout
    daemon.configure({"node": {"mode": "cluster"}})
    daemon.process.send_signal(signal.SIGHUP)
    daemon.wait_notify("READY=1")
    assert "mode:        cluster" in daemon.hcsctl("status").stdout
    assert "node mode cluster" in daemon.logs() and "node.mode changed" not in daemon.logs()


def test_sighup_applies_reloadable_keys_and_names_the_others(daemon: Daemon) -> None:
    daemon.start()
    assert daemon.process is not None
    assert "<7>" not in daemon.logs()  # info: no debug lines yet
    daemon.configure(
        {
            "daemon": {"shutdown_grace": 2, "log_level": "debug"},
            "runtime.driver_paths": {"nvidia": ["/opt/elsewhere"]},
        }
    )
    daemon.process.send_signal(signal.SIGHUP)
    daemon.wait_notify("READY=1")
    logs = daemon.logs()
    for key in ("daemon.shutdown_grace", "runtime.driver_paths.nvidia"):
        assert f"reload: {key} changed; it takes effect after a restart" in logs
    assert "daemon.log_level changed" not in logs

    daemon.configure({"daemon": {"socket": "x"}, "ledger": {"compact_after": 0}})
    daemon.process.send_signal(signal.SIGHUP)
    daemon.wait_notify("READY=1")
    assert (
        "reload failed, keeping the running configuration: "
        f"{daemon.config}: daemon.socket: expected an absolute path, got 'x'; "
        f"{daemon.config}: ledger.compact_after: expected a positive integer, got 0"
    ) in daemon.logs()

    assert daemon.stop() == 0
    logs = daemon.logs()
    assert "stopping: draining API calls (up to 1.0s)" in logs  # not applied: needs a restart
    assert "<7>task " in logs  # applied: debug lines from the shutdown


def test_driver_paths_reach_the_cdi_spec_and_the_containers(daemon: Daemon) -> None:
    from hcsd.api.client import Client
    from hcsd.api.v1 import hcsd_pb2 as pb

    driver = daemon.dir / "nvidia-driver"
    driver.mkdir()
    libhcs = daemon.dir / "libhcs.so"
    libhcs.write_bytes(b"placeholder: this test checks the mounts, not the library")
    daemon.configure(
        {
            "runtime": {"nri": False, "libhcs_path": libhcs},
            "runtime.driver_paths": {"nvidia": [str(driver), f"{daemon.dir}/absent"], "ascend": []},
        }
    )
    daemon.start()
    spec = json.loads((daemon.dir / "cdi" / "hcs.io-device.yaml").read_text())
    edits = {entry["name"]: entry["containerEdits"] for entry in spec["devices"]}
    # Every entry also carries libhcs and the preload file (CDI is an operator interface, and
    # its containers still run under libhcs); the driver paths decide the rest.
    quota_mounts = {str(libhcs), str(daemon.dir / "ld.so.preload")}
    nvidia = {m["hostPath"] for m in edits["nvidia-0"]["mounts"]}
    assert nvidia - quota_mounts == {str(driver)}
    assert {m["hostPath"] for m in edits["ascend-0"]["mounts"]} - quota_mounts == set()
    with Client(daemon.socket) as client:
        reply = client.prepare_container(
            pb.PrepareContainerRequest(
                container_id="driver-1",
                container_name="main",
                pod=pb.PodRef(namespace="ns", name="p", uid="u"),
                container_annotations={"hcs.io/vram": "1Gi", "hcs.io/vendors": "nvidia"},
            )
        )
    mounted = {m.host_path: m.container_path for m in reply.mounts}
    assert mounted[str(driver)] == str(driver)
    assert f"{daemon.dir}/absent" not in mounted


def test_state_survives_restart(daemon: Daemon) -> None:
    daemon.start()
    daemon.hcsctl("allocate", "--container", "keep", "--devices", "2", "--vendor", "ascend")
    assert daemon.stop() == 0
    daemon.start()
    listed = json.loads(daemon.hcsctl("--json", "allocations").stdout)
    assert [a["container_id"] for a in listed] == ["keep"]
    assert "ledger " in daemon.logs() and "1 allocation(s)" in daemon.logs()


def test_bad_config_exits_2_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[allocator]\npolicy = 'random'\n")
    result = subprocess.run(
        [sys.executable, "-m", "hcsd.daemon.lifecycle", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr == (
        f"hcsd: {config}: allocator.policy: expected one of binpack, spread, got 'random'\n"
    )


def test_busy_metrics_port_is_a_clear_start_up_error(daemon: Daemon) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", daemon.port))
        busy.listen()
        process = subprocess.run(
            [sys.executable, "-m", "hcsd.daemon.lifecycle", "--config", str(daemon.config)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert process.returncode == 1
    assert f"failed to serve metrics on 127.0.0.1:{daemon.port}" in process.stderr


def test_kernel_fault_marks_the_device_unhealthy_through_the_api(
    daemon: Daemon, bpf_objects: Path, kmsg_writer: Callable[..., None]
) -> None:
    daemon.configure({"health": {"source": "ebpf", "bpf_dir": bpf_objects}})
    daemon.start()
    assert "health:      ebpf" in daemon.hcsctl("status").stdout
    kmsg_writer("NVRM: Xid (PCI:0000:17:00): 79, pid=1, GPU has fallen off the bus.")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        health = json.loads(daemon.hcsctl("--json", "health").stdout)
        state = {d["uuid"]: d["health_state"] for d in health}
        if "HEALTH_STATE_UNHEALTHY" in state.values():
            break
        time.sleep(0.05)
    bad = [uuid for uuid, s in state.items() if s == "HEALTH_STATE_UNHEALTHY"]
    assert bad == ["GPU-5b2f0c0e-8d1a-4c11-9d2e-a100a100a000"]
    # New work avoids the unhealthy device: the other A100 takes it.
    placed = json.loads(
        daemon.hcsctl(
            "--json", "allocate", "--container", "after", "--vram", "1Gi", "--vendor", "nvidia"
        ).stdout
    )
    assert placed["allocation"]["grants"][0]["device_uuid"].endswith("a001")
    assert (
        "health: device GPU-5b2f0c0e-8d1a-4c11-9d2e-a100a100a000 (0000:17:00.0) healthy -> "
        "unhealthy: xid-79" in daemon.logs()
    )


async def test_prelaunched_plugin_relays_the_runtime_to_hcsd(daemon: Daemon) -> None:
    """As the runtime does: exec the plugin with the connection on fd 3 and an empty env."""
    import asyncio

    from tests.nri.peer import RuntimePeer

    libhcs = daemon.dir / "libhcs.so"
    libhcs.write_bytes(b"placeholder: this test checks the relay, not the library")
    daemon.configure({"runtime": {"libhcs_path": libhcs}})
    daemon.start()
    wrapper = daemon.dir / "10-hcsd"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"HCS_NRI_PRELAUNCH_SOCKET={daemon.dir}/nri-prelaunch.sock exec "
        f"{Path(sys.executable).parent}/hcs-nri-plugin\n"
    )
    wrapper.chmod(0o755)
    ours, theirs = socket.socketpair()
    plugin = subprocess.Popen(
        [str(wrapper)],
        env={"NRI_PLUGIN_NAME": "hcsd", "NRI_PLUGIN_IDX": "10", "NRI_PLUGIN_SOCKET": "3"},
        pass_fds=(3,),
        preexec_fn=lambda: os.dup2(theirs.fileno(), 3),  # noqa: PLW1509 - fd 3 as the runtime sets it
    )
    theirs.close()
    try:
        peer = RuntimePeer(*await asyncio.open_unix_connection(sock=ours))
        await asyncio.wait_for(peer.registered.wait(), 10)
        assert peer.registration is not None and peer.registration.plugin_idx == "10"
        from hcsd.runtime.nri.v1alpha1 import api_pb2 as api

        reply = await peer.call(
            "CreateContainer",
            api.ContainerRequest(
                pod=api.PodSandbox(name="p", namespace="ns", uid="u"),
                container=api.Container(
                    id="prelaunched-1", name="main", annotations={"hcs.io/vram": "1Gi"}
                ),
            ),
            api.CreateContainerResponse,
        )
        assert any(kv.key == "HCS_CONFIG" for kv in reply.adjust.env)
        held = json.loads(daemon.hcsctl("--json", "allocations").stdout)
        assert [a["container_id"] for a in held] == ["prelaunched-1"]
        peer.close()
        for _ in range(200):  # let the loop close the socket: EOF from the runtime ends the relay
            await asyncio.sleep(0.05)
            if plugin.poll() is not None:
                break
        assert plugin.returncode == 0
    finally:
        if plugin.poll() is None:
            plugin.kill()
