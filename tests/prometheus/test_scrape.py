"""A real Prometheus scrapes hcsd on every simulated node and the extender on the real control
plane, with the rule file loaded: every target is up, every dashboard panel's query returns
data, every recording rule produces series, every rule evaluates without error.

What makes the data: a pod placed by kube-scheduler through the extender (the cluster's ACU
and VRAM allocated, the scheduling latency), a pod no node can take (pending), a
ComputeQuota, a local allocation on one hcsd (its allocations and API latency), and the
NPU node's unhealthy device (health and its reason).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest
import yaml

from tests.cluster.conftest import Cluster
from tests.harness.prometheus import RULES, Prometheus, find, panel_queries

NAMESPACE = "metrics-team"
WAIT = 90.0  # a query's data: scrapes and rule evaluations every second, rates over two


@pytest.fixture(scope="module")
def prometheus(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    binary = find("prometheus")
    if binary is None:
        pytest.skip("SKIP prometheus tests: prometheus is not installed (apt install prometheus)")
    jobs = {
        "hcsd": [f"127.0.0.1:{d.port}" for d in cluster.daemons.values()],
        "hcs-scheduler-extender": [f"127.0.0.1:{cluster.probe_port}"],
    }
    server = Prometheus(tmp_path_factory.mktemp("prometheus"), jobs).start(binary)
    try:
        wait_for(lambda: all_up(server), "every target up", server)
        make_data(cluster)
        yield server
    finally:
        server.close()


def all_up(server: Prometheus) -> bool:
    targets = server.api("targets")["activeTargets"]
    return len(targets) == 5 and all(t["health"] == "up" for t in targets)


def make_data(cluster: Cluster) -> None:
    cluster.kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": NAMESPACE}})  # fmt: skip
    cluster.kube.create(f"/apis/hcs.io/v1alpha1/namespaces/{NAMESPACE}/computequotas", {
        "apiVersion": "hcs.io/v1alpha1", "kind": "ComputeQuota",
        "metadata": {"name": "limits", "namespace": NAMESPACE},
        "spec": {"hard": {"vram": "64Gi", "devices": 4}},
    })  # fmt: skip
    asks = {"ai.compute/vram": "16Gi", "ai.compute/tflops-fp16": "100"}  # reserves compute too
    cluster.create_pod(
        "placed", namespace=NAMESPACE, resources=asks, annotations={"hcs.io/vendors": "nvidia"}
    )
    placed = cluster.wait_pod("placed", namespace=NAMESPACE)
    assert placed["spec"].get("nodeName") == "gpu-node", placed.get("status")
    cluster.create_pod("too-big", resources={"ai.compute/vram": "4096Gi"})
    cluster.wait_pod("too-big")
    local = cluster.daemons["mlu-node"].hcsctl("allocate", "--container", "m1", "--vram", "1Gi")
    assert local.returncode == 0, local.stderr


def wait_for(check: object, what: str, server: Prometheus, timeout: float = WAIT) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"no {what} after {timeout}s:\n{server.log()}"
        time.sleep(0.5)


def has_numbers(server: Prometheus, expr: str) -> bool:
    return any(math.isfinite(float(s["value"][1])) for s in server.query(expr))


def test_every_target_is_up(prometheus: Prometheus) -> None:
    targets = prometheus.api("targets")["activeTargets"]
    assert {t["labels"]["job"] for t in targets} == {"hcsd", "hcs-scheduler-extender"}
    assert [t["lastError"] for t in targets if t["health"] != "up"] == []


@pytest.mark.parametrize(("title", "expr"), panel_queries(), ids=[t for t, _ in panel_queries()])
def test_every_dashboard_query_returns_data(prometheus: Prometheus, title: str, expr: str) -> None:
    wait_for(lambda: has_numbers(prometheus, expr), f"data for {title!r}: {expr}", prometheus)


def test_every_recording_rule_produces_series(prometheus: Prometheus) -> None:
    names = [
        rule["record"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    ]
    for name in names:
        wait_for(lambda n=name: has_numbers(prometheus, n), f"series of {name}", prometheus)
    assert float(prometheus.query("namespace:hcs_extender_pending_pods:sum")[0]["value"][1]) >= 1
    acu = {
        s["metric"]["model"]: float(s["value"][1])
        for s in prometheus.query("vendor_model:hcs_cluster_acu_allocated:max")
    }
    assert acu.get("A100-SXM4-80GB", 0) > 0, acu  # the placed pod reserves compute on the A100
    vram = prometheus.query('vendor_model:hcs_cluster_vram_allocated_bytes:max{vendor="nvidia"}')
    assert float(vram[0]["value"][1]) >= 16 * 2**30


def test_every_rule_evaluates_without_error(prometheus: Prometheus) -> None:
    groups = prometheus.api("rules")["groups"]
    loaded = {g["name"] for g in groups}
    assert loaded == {g["name"] for g in yaml.safe_load(RULES.read_text())["groups"]}
    # past one evaluation of each group (a rule not yet evaluated has health "unknown")
    wait_for(lambda: all(r.get("health") != "unknown" for g in prometheus.api("rules")["groups"]
                         for r in g["rules"]), "evaluation of every rule", prometheus)  # fmt: skip
    broken = [
        (r["name"], r.get("lastError"))
        for g in prometheus.api("rules")["groups"]
        for r in g["rules"]
        if r.get("health") != "ok"
    ]
    assert broken == []


def test_the_unhealthy_npu_is_seen_with_its_reason(prometheus: Prometheus) -> None:
    expr = "hcs_device_health_reason * on (instance) group_left (node) hcs_build_info"
    wait_for(lambda: bool(prometheus.query(expr)), "the NPU's health reason", prometheus)
    rows = [s["metric"] for s in prometheus.query(expr)]
    assert [(r["node"], r["device"][:3]) for r in rows] == [("npu-node", "NPU")]


def test_the_unhealthy_npu_raises_its_alert_with_its_reason(prometheus: Prometheus) -> None:
    """The rule's `for:` is a minute: the alert is pending from its first evaluation."""
    expr = 'ALERTS{alertname="HcsDeviceUnhealthy", alertstate=~"pending|firing"}'
    wait_for(lambda: bool(prometheus.query(expr)), "HcsDeviceUnhealthy pending", prometheus)
    rows = [s["metric"] for s in prometheus.query(expr)]
    assert [(r["node"], r["device"][:3], r["state"]) for r in rows] == [
        ("npu-node", "NPU", "unhealthy")
    ]
    alerts = [a for a in prometheus.api("alerts")["alerts"]
              if a["labels"]["alertname"] == "HcsDeviceUnhealthy"]  # fmt: skip
    reason = prometheus.query("hcs_device_health_reason")[0]["metric"]["reason"]
    assert f"unhealthy: {reason}." in alerts[0]["annotations"]["description"]
