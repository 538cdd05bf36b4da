"""`kubelet_cluster`: the two-node real-kubelet cluster, once per test session.

Any suite may ask for it (tests/conftest.py registers it): the first test that does starts
the cluster (about 20 s once the peers are built), the session's end stops it and checks
that nothing was left. Tests share it, so each deletes the pods it made. Without what the
cluster needs (root, cgroup v1, Go for the first build, a host address for kubelet) every
test asking for it skips, saying why.

`bare_kubelet_cluster`: the same nodes and control plane without HCS's cluster side
(cluster.py, `bare`), once per module that asks, for tests that deploy HCS themselves.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.kubecluster.cluster import (
    NODES,
    KubeletCluster,
    find_peers,
    started,
    with_stamped_apiserver,
)
from tests.harness.kubecluster.vendors import ASCEND, NVIDIA, VendorNode
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
) -> Iterator[KubeletCluster]:
    """`stamped`: the API server reports the release (helm reads it), see
    cluster.with_stamped_apiserver."""
    say = _say(pytestconfig)
    peers = find_peers(say)
    if stamped and not isinstance(peers, str):
        peers = with_stamped_apiserver(peers, work, say)
    if isinstance(peers, str):
        pytest.skip(f"SKIP the real-kubelet cluster: {peers}")
    cluster = started(peers, work, say, bare=bare, vendors=vendors)
    say(
        "kubelet cluster{bare}: up in {total:.1f} s (control plane {plane:.1f} s)".format(
            bare=" (bare)" if bare else "",
            total=cluster.timings["total"],
            plane=cluster.timings["control plane"],
        )
    )
    try:
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
