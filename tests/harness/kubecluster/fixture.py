"""`kubelet_cluster`: the two-node real-kubelet cluster, once per test session.

Any suite may ask for it (tests/conftest.py registers it): the first test that does starts
the cluster (about 20 s once the peers are built), the session's end stops it and checks
that nothing was left. Tests share it, so each deletes the pods it made. Without what the
cluster needs (root, cgroup v1, Go for the first build, a host address for kubelet) every
test asking for it skips, saying why.

`bare_kubelet_cluster`: the same nodes and control plane without HCS's cluster side
(cluster.py, `bare`), once per module that asks, for tests that deploy HCS themselves.

`dra_kubelet_cluster`: the bare cluster for installing HCS in DRA mode with the chart
(tests/kubelet/test_dra_install.py): its own node names, three A100s on `dra-gpu` (the first
alone, the other two one NVLink island), the API server stamped v1.36.3 (helm reads it),
hcsd's health quiet period short so that a device found unhealthy recovers within a test.

`healing_kubelet_cluster`: HCS deployed, hcsd watching the kernel through eBPF with short
clocks, hcs-controller running (healing.py), once per module that asks; it skips, saying
why, where the eBPF objects cannot be built or loaded.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hcsd.api.client import Client
from tests.harness.daemon import Settings
from tests.harness.kubecluster import healing
from tests.harness.kubecluster.cluster import (
    NODES,
    KubeletCluster,
    find_peers,
    started,
    with_stamped_apiserver,
)
from tests.harness.kubecluster.vendors import A100_ISLAND, ASCEND, NVIDIA, VendorNode
from tests.harness.peers.building import Log

#: The bare cluster's nodes: the same vendors under other names (the cgroup roots and the
#: Node objects are named after them).
BARE_NODES: dict[str, VendorNode] = {"bare-gpu": NVIDIA, "bare-npu": ASCEND}


def _say(pytestconfig: pytest.Config) -> Log:
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")

    def say(message: str) -> None:  # past pytest's capture: builds take minutes
        if capture is None:
            print(message, file=sys.stderr, flush=True)
            return
        with capture.global_and_fixture_disabled():
            print(message, file=sys.stderr, flush=True)

    return say


def _cluster(
    pytestconfig: pytest.Config,
    work: Path,
    *,
    bare: bool,
    vendors: dict[str, VendorNode],
    stamped: bool = False,
    hcsd_settings: dict[str, Settings] | None = None,
    prepare: Callable[[KubeletCluster], None] | None = None,
) -> Iterator[KubeletCluster]:
    """`stamped`: the API server reports the release (helm reads it), see
    cluster.with_stamped_apiserver; `prepare`: run on the started cluster (it may skip)."""
    say = _say(pytestconfig)
    peers = find_peers(say)
    if stamped and not isinstance(peers, str):
        peers = with_stamped_apiserver(peers, work, say)
    if isinstance(peers, str):
        pytest.skip(f"SKIP the real-kubelet cluster: {peers}")
    cluster = started(peers, work, say, bare=bare, vendors=vendors, hcsd_settings=hcsd_settings)
    say(
        "kubelet cluster{bare}: up in {total:.1f} s (control plane {plane:.1f} s)".format(
            bare=" (bare)" if bare else "",
            total=cluster.timings["total"],
            plane=cluster.timings["control plane"],
        )
    )
    try:
        if prepare is not None:
            prepare(cluster)
        yield cluster
    finally:
        problems = cluster.close()
    assert not problems, f"the kubelet cluster left things behind: {problems}"


@pytest.fixture(scope="session")
def kubelet_cluster(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeletCluster]:
    yield from _cluster(pytestconfig, tmp_path_factory.mktemp("kubelet"), bare=False,
                        vendors=NODES)  # fmt: skip


@pytest.fixture(scope="module")
def bare_kubelet_cluster(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeletCluster]:
    """The nodes (with hcsd) and the control plane, without HCS's cluster side, for the
    module's tests to deploy it. Its nodes are named apart from `kubelet_cluster`'s, which
    may be running at the same time; it stops at the module's end."""
    yield from _cluster(pytestconfig, tmp_path_factory.mktemp("bare-kubelet"), bare=True,
                        vendors=BARE_NODES)  # fmt: skip


@pytest.fixture(scope="module")
def stamped_bare_kubelet_cluster(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeletCluster]:
    """`bare_kubelet_cluster` whose API server reports v1.36.3 (v0.0.0-master otherwise),
    for `helm install` on kubelets (tests/kubelet/test_helm_install.py)."""
    yield from _cluster(pytestconfig, tmp_path_factory.mktemp("helm-kubelet"), bare=True,
                        vendors=BARE_NODES, stamped=True)  # fmt: skip


#: The DRA install's nodes, named apart from the other clusters' (one may run at the same time);
#: the GPU node has a lone A100 and an NVLink pair, for claims of several devices.
DRA_NODES: dict[str, VendorNode] = {"dra-gpu": A100_ISLAND, "dra-npu": ASCEND}
#: Seconds a device hcsd found unhealthy stays so once its counters are quiet (docs/health.md).
DRA_QUIET_PERIOD = 8.0


@pytest.fixture(scope="module")
def dra_kubelet_cluster(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeletCluster]:
    """`stamped_bare_kubelet_cluster` on nodes `dra-gpu` and `dra-npu` whose hcsd polls the
    simulated devices' counters every 0.2 s (health.aer_poll_interval) and calls a device
    healthy again DRA_QUIET_PERIOD seconds after its last fatal count."""
    health: Settings = {"health": {"quiet_period": DRA_QUIET_PERIOD, "tick_interval": 0.2,
                                   "aer_poll_interval": 0.2}}  # fmt: skip
    yield from _cluster(pytestconfig, tmp_path_factory.mktemp("dra-kubelet"), bare=True,
                        vendors=DRA_NODES, stamped=True,
                        hcsd_settings=dict.fromkeys(DRA_NODES, health))  # fmt: skip


@pytest.fixture(scope="module")
def healing_kubelet_cluster(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory, bpf_objects: Path
) -> Iterator[KubeletCluster]:
    """The self-healing cluster (healing.py): nodes `heal-gpu` and `heal-npu` with devices at
    PCI addresses of their own and a fake sysfs each, hcsd's health watching on (eBPF),
    hcs-controller running. Stops at the module's end."""
    work = tmp_path_factory.mktemp("healing-kubelet")
    nodes = healing.vendors()
    for name, vendor in nodes.items():
        healing.make_node_sysfs(work, name, vendor)
    settings = {name: healing.hcsd_settings(work, name, bpf_objects) for name in nodes}
    yield from _cluster(pytestconfig, work, bare=False, vendors=nodes, hcsd_settings=settings,
                        prepare=_watching_the_kernel)  # fmt: skip


def _watching_the_kernel(cluster: KubeletCluster) -> None:
    """Skip (saying why) unless every node's hcsd watches the kernel through eBPF; then start
    hcs-controller."""
    for name, node in cluster.nodes.items():
        assert node.hcsd is not None
        with Client(node.hcsd.socket) as client:
            source = client.node().health_source
        if source != "ebpf":
            why = [line for line in node.hcsd.logs().splitlines() if "source unavailable" in line]
            pytest.skip(
                f"SKIP self-healing: hcsd on {name} cannot watch the kernel through eBPF "
                f"(health source {source!r}): {' '.join(why) or 'see its log'}"
            )
    cluster.start_controller(healing.controller_flags())
