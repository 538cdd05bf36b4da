"""The watchdog end to end: real processes in real cgroups allocating through the fake driver,
libhcs in front of some of them, NVML reporting what each really holds.

A container "escapes libhcs" here the way a workload does in the field: one of its processes
runs without the preload (its environment dropped LD_PRELOAD), so the driver hands it memory
that libhcs never sees; only the driver's own per-process figure shows it.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from hcsd.model import Allocation, VramViolation
from hcsd.watchdog import Policy, Tolerance, Watchdog, WatchdogSettings
from hcsd.watchdog.accounted import AccountedUsage
from hcsd.watchdog.metric_families import families
from hcsd.watchdog.readers.nvml import NvmlReader
from hcsd.watchdog.settings import WatchdogSection
from tests.watchdog.cgroup import Container, Containers
from tests.watchdog.conftest import (
    UUIDS,
    GiB,
    GpuNode,
    allocated,
    allocation,
    gpu_devices,
    quota_dir,
)
from tests.watchdog.test_killing import alive, wait_dead

MiB = 2**20


class Node:
    """A watchdog over the fake GPU node, with the allocations and events of a test."""

    def __init__(self, gpu: GpuNode, policy: Policy, tolerance: Tolerance | None = None) -> None:
        self.gpu = gpu
        self.run_dir = gpu.root / "run"
        self.held: list[Allocation] = []
        self.events: list[VramViolation] = []
        self.reader = NvmlReader(gpu_devices(2), library=str(gpu.library))
        self.watchdog = Watchdog(
            [self.reader],
            lambda: self.held,
            self.events.append,
            WatchdogSettings(
                interval=1.0,
                policy=policy,
                tolerance=tolerance or WatchdogSection().tolerance(),
            ),
            accounted=AccountedUsage(self.run_dir),
        )

    def grant(self, container: Container, grants: dict[int, int], pod: str = "") -> Allocation:
        held = allocation(container, grants, pod=pod)
        self.held.append(held)
        quota_dir(self.run_dir, held)
        return held

    def run(
        self,
        container: Container | None,
        mib: int,
        count: int,
        *,
        libhcs: Path | None = None,
        device: int = 0,
    ) -> subprocess.Popen[bytes]:
        """gpu_app allocating `count` x `mib` MiB; through libhcs when given."""
        env = self.gpu.workload_env(device)
        if libhcs is not None:
            assert container is not None
            env["LD_PRELOAD"] = str(libhcs)
            env["HCS_CONFIG"] = str(self.run_dir / "containers" / container.id / "quota.conf")
        argv = [str(self.gpu.library.parent / "gpu_app"), str(mib), str(count)]
        if container is None:
            process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE)
        else:
            process = container.spawn(argv, env=env)
        allocated(process)
        return process


@pytest.fixture
def node_factory(gpu_node: GpuNode):  # type: ignore[no-untyped-def]
    made: list[Node] = []

    def make(policy: Policy, tolerance: Tolerance | None = None) -> Node:
        made.append(Node(gpu_node, policy, tolerance))
        return made[-1]

    yield make
    for node in made:
        node.watchdog.close()


def test_escape_is_caught_within_two_polls_and_killed(
    node_factory, containers: Containers, libhcs: Path, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    node = node_factory(Policy.KILL)
    honest, escaping = containers.new(pod="a"), containers.new(pod="b")
    node.grant(honest, {0: 4 * GiB}, pod="honest")
    node.grant(escaping, {0: 4 * GiB}, pod="escaping")
    kept = node.run(honest, 1024, 8, libhcs=libhcs)  # libhcs stops it at its 4Gi
    first = node.run(escaping, 1024, 3, libhcs=libhcs)  # 3Gi, accounted by libhcs
    assert node.watchdog.poll().events == []  # everyone within their grant so far
    # Now a process of the second container runs without the preload and takes 6Gi more.
    escaped = node.run(escaping, 1024, 6)
    caplog.set_level(logging.WARNING)
    polls = 0
    while not node.events and polls < 2:
        node.watchdog.poll()
        polls += 1
    assert len(node.events) == 1, f"not detected within two polls: {node.events}"
    event = node.events[0]
    assert (event.container_id, event.device_uuid, event.action) == (
        escaping.id,
        UUIDS[0],
        "killed",
    )
    assert event.used_bytes == 9 * GiB and event.granted_bytes == 4 * GiB
    assert event.accounted_bytes == 3 * GiB  # what libhcs saw: the escaped 6Gi is not in it
    assert sorted(event.pids) == sorted([first.pid, escaped.pid])
    assert wait_dead({first.pid, escaped.pid}) == set()
    assert escaping.pids() == set()
    assert alive(kept.pid)  # the container that kept to its grant runs on
    line = next(r.getMessage() for r in caplog.records if "holds 9Gi" in r.getMessage())
    assert line.startswith("team-a/escaping/main: holds 9Gi of device memory on GPU-")
    assert "libhcs accounted 3Gi: 6Gi escaped libhcs" in line and "policy kill: SIGKILL" in line
    after = node.watchdog.poll()  # the driver freed what the dead held
    assert after.events == [] and after.assessment.violations == []
    honest_usage = next(
        u for u in after.assessment.containers if u.allocation.container_id == honest.id
    )
    assert honest_usage.used_bytes == honest_usage.accounted_bytes == 4 * GiB


def test_warn_policy_only_warns_once_per_episode(
    node_factory, containers: Containers, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    node = node_factory(Policy.WARN)
    container = containers.new()
    node.grant(container, {0: 2 * GiB})
    process = node.run(container, 1024, 5)  # 5Gi on a 2Gi grant, no libhcs at all
    caplog.set_level(logging.INFO)
    for _ in range(3):
        node.watchdog.poll()
    assert [e.action for e in node.events] == ["warned"]  # one event for the episode
    assert node.events[0].accounted_bytes == -1  # it never loaded libhcs: no region
    assert alive(process.pid) and process.poll() is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("policy warn: not killed" in w for w in warnings) == 1
    assert warnings[0].startswith(f"{container.id}: holds 5Gi")  # no pod: the container id
    process.kill()
    process.wait()
    node.watchdog.poll()
    assert f"{container.id}: back within its grant on {UUIDS[0]}" in caplog.text
    by_name = {f.name: f for f in families(node.watchdog)}
    assert by_name["hcs_vram_violations_total"].samples[2] == ((("action", "warned"),), 1)
    assert by_name["hcs_watchdog_polls_total"].samples == [((), 4)]


@pytest.mark.parametrize(
    ("mib", "over"),
    [
        # 1Gi grant: allowed 1Gi + 5% (51.2Mi) + 1Gi for its one process = 2099.2Mi
        pytest.param(2099, False, id="inside-the-tolerance"),
        pytest.param(2100, True, id="past-it"),
    ],
)
def test_tolerance_is_respected(node_factory, containers: Containers, mib: int, over: bool) -> None:  # type: ignore[no-untyped-def]
    node = node_factory(Policy.KILL)
    container = containers.new()
    node.grant(container, {0: GiB})
    process = node.run(container, mib, 1)
    result = node.watchdog.poll()
    assert [u.used_bytes for u in result.assessment.containers] == [mib * MiB]
    assert bool(node.events) is over
    if over:
        assert wait_dead({process.pid}) == set()
    else:
        assert alive(process.pid)


def test_memory_on_a_device_it_was_not_granted(node_factory, containers: Containers) -> None:  # type: ignore[no-untyped-def]
    node = node_factory(Policy.WARN)
    container = containers.new()
    node.grant(container, {0: 8 * GiB})
    node.run(container, 1024, 2, device=1)  # 2Gi on GPU 1, where it holds nothing
    node.watchdog.poll()
    (event,) = node.events
    assert (event.device_uuid, event.granted_bytes, event.used_bytes) == (UUIDS[1], 0, 2 * GiB)


def test_processes_of_no_known_container_are_reported(
    node_factory, containers: Containers, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    node = node_factory(Policy.KILL)
    unknown = containers.new()  # a container hcsd granted nothing (started outside it)
    in_container = node.run(unknown, 1024, 2)
    on_host = node.run(None, 512, 1)
    caplog.set_level(logging.WARNING)
    node.watchdog.poll()
    node.watchdog.poll()
    assert node.events == []  # nothing to enforce: no grant was crossed
    assert alive(in_container.pid) and alive(on_host.pid)  # and nothing killed
    lines = [r.getMessage() for r in caplog.records]
    assert (
        sum(
            f"pid {in_container.pid} (container {unknown.id[:12]} holds no grant)" in m
            for m in lines
        )
        == 1
    )
    assert sum(f"pid {on_host.pid} (in no container) holds 512Mi" in m for m in lines) == 1
    by_name = {f.name: f for f in families(node.watchdog)}
    unattributed = dict(by_name["hcs_device_vram_unattributed_bytes"].samples)
    assert unattributed[(("device", UUIDS[0]),)] == 2 * GiB + 512 * MiB
    on_host.kill()
    on_host.wait()


def test_a_failing_reader_is_logged_once_and_retried(
    node_factory, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    node = node_factory(Policy.WARN)
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(tmp_path / "missing.conf"))  # init fails
    caplog.set_level(logging.INFO)
    node.watchdog.poll()
    node.watchdog.poll()
    assert caplog.text.count("failed to initialise NVML") == 1
    assert node.watchdog.reader_errors["nvml"] == 2
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(node.gpu.config))
    assert node.watchdog.poll().assessment.devices != []
    assert "nvml answers again" in caplog.text
