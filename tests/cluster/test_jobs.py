"""A distributed job through the real kube-scheduler and hcs-scheduler-extender: 64 pods of
one device each on 16 simulated nodes of eight, all bound, no device held twice.

The bound asserted is generous (a loaded 2-core machine must not fail it); the real figure
is bench/job_bench.py's (docs/cluster.md)."""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from hcsd.contract.keyring import Keyring
from tests.cluster.conftest import _requirements, kustomized, secret_with
from tests.cluster.controlplane import ControlPlane, manifests
from tests.cluster.jobs import (
    ExtenderProcess,
    bookings,
    create_job,
    pod_nodes,
    simulated_fleet,
    start_extender,
    wait_bound,
)
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.slow

KEY = secrets.token_hex(32).encode()
NODES = [f"job-node-{i:02d}" for i in range(16)]


@pytest.fixture(scope="module")
def scheduling(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ControlPlane, Path, ExtenderProcess]]:
    binaries, etcd = _requirements()
    work = tmp_path_factory.mktemp("jobs")
    plane = ControlPlane(binaries, etcd, work).start()
    try:
        shipped = [d for d in manifests(*kustomized()) if d["kind"] != "Secret"]
        plane.apply(shipped + secret_with(Keyring({"k1": KEY}, "k1")))
        simulated_fleet(plane.kube(), NODES)
        extender = start_extender(plane, work, KEY)
        plane.start_scheduler(extender.url)
        yield plane, work, extender
    finally:
        plane.stop_process("extender")
        plane.stop()


def test_a_64_pod_job_is_bound_whole_without_double_booking(
    scheduling: tuple[ControlPlane, Path, ExtenderProcess],
) -> None:
    plane, work, extender = scheduling
    kube = plane.kube()
    create_job(kube, "job", "train", 64, {"ai.compute/devices": "1"})
    try:
        wait_bound(kube, "job", 64, timeout=60)
    except TimeoutError as e:
        log = (work / "extender.log").read_text(errors="replace")[-3000:]
        raise AssertionError(f"{e}\n{log}\n{plane.tail('kube-scheduler')}") from None
    held = bookings(kube, "job", Keyring({"k1": KEY}, "k1"))  # every assignment verifies
    assert {who for pods in held.values() for who in pods} == set(pod_nodes(kube, "job"))
    assert [device for device, pods in held.items() if len(pods) > 1] == []
    assert len(held) == 64  # 64 devices, one per pod
    per_node = Counter(node for node, _ in held)
    assert set(per_node) <= set(NODES) and max(per_node.values()) <= 8
    # Every bind read its pod once, mostly from the extender's watch (a GET for one it had
    # not shown yet). Binds include the refused ones (kube-scheduler races at a node's last
    # device), so they are counted, not assumed to be 64. A bind is counted when its Binding
    # call returns, a moment after the watch can show the pod bound.
    ok = 'hcs_extender_binds_total{result="ok"}'
    wait_for(lambda: extender.metric(ok) >= 64, "every bind counted", timeout=10)
    binds = {
        r: extender.metric(f'hcs_extender_binds_total{{result="{r}"}}') for r in ("ok", "error")
    }
    reads = {s: extender.metric(f'hcs_extender_bind_pod_reads_total{{source="{s}"}}')
             for s in ("watch", "get")}  # fmt: skip
    assert binds["ok"] == 64, binds
    assert reads["watch"] + reads["get"] == binds["ok"] + binds["error"], (reads, binds)
    assert reads["watch"] >= 0.5 * (binds["ok"] + binds["error"]), (reads, binds)
