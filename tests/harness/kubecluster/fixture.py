"""`kubelet_cluster`: the two-node real-kubelet cluster, once per test session.

Any suite may ask for it (tests/conftest.py registers it): the first test that does starts
the cluster (about 20 s once the peers are built), the session's end stops it and checks
that nothing was left. Tests share it, so each deletes the pods it made. Without what the
cluster needs (root, cgroup v1, Go for the first build, a host address for kubelet) every
test asking for it skips, saying why.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.harness.kubecluster.cluster import KubeletCluster, find_peers, started


@pytest.fixture(scope="session")
def kubelet_cluster(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeletCluster]:
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")

    def say(message: str) -> None:  # past pytest's capture: builds take minutes
        if capture is None:
            print(message, file=sys.stderr, flush=True)
            return
        with capture.global_and_fixture_disabled():
            print(message, file=sys.stderr, flush=True)

    peers = find_peers(say)
    if isinstance(peers, str):
        pytest.skip(f"SKIP the real-kubelet cluster: {peers}")
    cluster = started(peers, tmp_path_factory.mktemp("kubelet"), say)
    say(
        "kubelet cluster: up in {total:.1f} s (control plane {plane:.1f} s)".format(
            total=cluster.timings["total"], plane=cluster.timings["control plane"]
        )
    )
    try:
        yield cluster
    finally:
        problems = cluster.close()
    assert not problems, f"the kubelet cluster left things behind: {problems}"
