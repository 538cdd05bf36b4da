"""The cluster view's figures on objects as the syncer and the extender write them, its text
and JSON, where it finds credentials, and that hcsctl's node commands do not load the
Kubernetes client."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cli import cluster_tables, kubectl_hcs
from hcsd.cli.cluster_tables import view_json, view_text
from hcsd.cluster.cluster_reader import ViewError, find_kubeconfig
from hcsd.cluster.cluster_view import Source, summarise, totals
from hcsd.cluster.objects import REASON_MAX, compute_node, node_spec, node_status
from hcsd.quantity import format_bytes

GiB = 2**30
SOURCE = Source("https://api.example:6443", "/k", "prod")
ACU_TFLOPS = 3.12  # 1% of an A100's 312


def device(uuid: str, index: int, **fields: Any) -> pb.Device:
    base: dict[str, Any] = {
        "vendor": "nvidia",
        "model": "A100-SXM4-80GB",
        "vram_bytes": 80 * GiB,
        "tflops_fp16": 312.0,
        "health_state": pb.HEALTH_STATE_HEALTHY,
        "health_score": 100,
    }
    return pb.Device(uuid=uuid, index=index, **{**base, **fields})


def synced(name: str, devices: list[pb.Device]) -> dict[str, Any]:
    """The ComputeNode the syncer writes for hcsd's `devices` (allocations aside)."""
    obj = compute_node(name, node_spec(pb.Node(name=name), devices))
    obj["status"] = node_status(devices, [], previous={}, now="2026-01-01T00:00:00Z")
    return obj


NODES = [
    synced(
        "gpu-a",
        [
            # a whole device (100%), and a 16Gi slice reserving half of the other
            device("a-0", 0, vram_allocated_bytes=80 * GiB, compute_allocated_percent=100),
            device("a-1", 1, vram_allocated_bytes=16 * GiB, compute_allocated_percent=50),
        ],
    ),
    synced(
        "gpu-b",
        [
            # measured on its node, a VRAM-only slice (reserves no compute)
            device(
                "b-0",
                0,
                tflops_fp16=296.4,
                attributes={"fingerprint": "measured"},
                vram_allocated_bytes=8 * GiB,
            ),
            device(
                "b-1",
                1,
                health_state=pb.HEALTH_STATE_DEGRADED,
                health_score=60,
                attributes={"health_reason": "xid-48: double-bit ECC error"},
            ),
        ],
    ),
    synced(
        "npu-a",
        [
            device(
                "n-0",
                0,
                vendor="ascend",
                model="Ascend910B3",
                vram_bytes=64 * GiB,
                tflops_fp16=313.0,
                health_state=pb.HEALTH_STATE_LOST,
                health_score=0,
            ),
        ],
    ),
]


def pod(name: str, phase: str = "Pending", **parts: Any) -> dict[str, Any]:
    resources = parts.pop("limits", None)
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "resources": {"limits": resources} if resources else {}}]
    }
    spec.update(parts.pop("spec", {}))
    return {
        "metadata": {"name": name, "namespace": "team", "creationTimestamp":
                     "2026-01-01T00:00:00Z", **parts.pop("meta", {})},
        "spec": spec,
        "status": {"phase": phase, **parts.pop("status", {})},
    }  # fmt: skip


REFUSED = {
    "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/3 nodes are available: 3 no device with 200Gi free."},
    ]
}  # fmt: skip
PODS = [
    pod("big", limits={"ai.compute/vram": "200Gi"}, status=REFUSED),
    pod("plain"),  # Pending, but asks nothing of HCS
    pod("running", phase="Running", limits={"ai.compute/vram": "1Gi"}),
    pod("by-name", spec={"schedulerName": "hcs-scheduler"}),
    pod("hinted", meta={"annotations": {"hcs.io/vendors": "nvidia"}}),
    pod("leaving", limits={"ai.compute/devices": "1"},
        meta={"deletionTimestamp": "2026-01-01T00:01:00Z"}),
    pod("starting", limits={"ai.compute/devices": "2"}, spec={"nodeName": "gpu-a"},
        status={"containerStatuses": [{"state": {"waiting": {
            "reason": "ContainerCreating", "message": ""}}}]}),
]  # fmt: skip
QUOTAS = [
    {
        "metadata": {"namespace": "team", "name": "limits"},
        "spec": {"hard": {"vram": "100Gi", "devices": 4}},
        "status": {"used": {"vram": "16Gi", "tflops-fp16": "0", "devices": "1"}},
    }
]


def test_figures_per_vendor_and_model() -> None:
    view = summarise(NODES, [], [])
    npu, a100 = view.models  # by vendor, then model
    assert (a100.vendor, a100.model, sorted(a100.nodes)) == (
        "nvidia", "A100-SXM4-80GB", ["gpu-a", "gpu-b"],
    )  # fmt: skip
    assert (a100.devices, a100.not_healthy) == (4, 1)
    assert (a100.vram_total, a100.vram_used, a100.vram_free) == (320 * GiB, 104 * GiB, 216 * GiB)
    # 100 ACU per A100 from the profile, 95 measured; used: 100% + 50% of 100, the slice 0
    assert (a100.acu_total, a100.acu_used) == (pytest.approx(395.0), pytest.approx(150.0))
    assert (a100.measured, a100.acu_source) == (1, "measured 1/4")
    assert (npu.vendor, npu.devices, npu.not_healthy, npu.acu_source) == ("ascend", 1, 1, "profile")
    assert npu.acu_total == pytest.approx(100.3)
    assert view.nodes == {"gpu-a": "Ready", "gpu-b": "Degraded", "npu-a": "NotReady"}
    everything = totals(view.models)
    assert (everything.devices, everything.vram_total) == (5, 384 * GiB)


def test_the_syncers_summary_fields_agree_with_the_view() -> None:
    """kubectl get computenodes (the status summary) and hcsctl cluster say the same."""
    for obj in NODES:
        status = obj["status"]
        node = totals(summarise([obj], [], []).models)
        assert status["acuTotal"] == pytest.approx(node.acu_total)
        assert status["acuAllocated"] == pytest.approx(node.acu_used)
        assert status["vramAllocated"] == (format_bytes(node.vram_used) if node.vram_used else "0")
        assert status["unhealthyDevices"] == node.not_healthy
        measured = [d["fingerprint"] == "measured" for d in obj["spec"]["devices"]]
        assert sum(measured) == node.measured
    assert [NODES[0]["status"]["acuAllocated"], NODES[1]["status"]["unhealthyDevices"]] == [150, 1]


def test_devices_not_healthy_with_node_and_reason() -> None:
    view = summarise(NODES, [], [])
    assert [(d.node, d.uuid, d.health, d.score, d.reason) for d in view.sick] == [
        ("gpu-b", "b-1", "degraded", 60, "xid-48: double-bit ECC error"),
        ("npu-a", "n-0", "lost", 0, ""),
    ]


def test_pending_accelerator_pods_with_the_schedulers_reason() -> None:
    view = summarise([], PODS, [])
    assert [p.name for p in view.pending] == ["big", "by-name", "hinted", "starting"]
    big = view.pending[0]
    assert big.asks == {"ai.compute/vram": "200Gi"}
    assert (big.reason, big.message) == (
        "Unschedulable", "0/3 nodes are available: 3 no device with 200Gi free.",
    )  # fmt: skip
    starting = view.pending[3]
    assert (starting.node, starting.reason) == ("gpu-a", "ContainerCreating")
    assert starting.message == "bound, containers not started yet (it carries no hcs.io/assignment)"
    assert view.pending[1].scheduler == "hcs-scheduler"


def test_a_malformed_compute_node_is_named_not_fatal() -> None:
    broken = {"metadata": {"name": "bad"}, "spec": {"devices": [{"uuid": "x"}]}}
    # the first device reads, the second's usage does not: the node is left out whole
    half = json.loads(json.dumps(NODES[1]))
    half["metadata"]["name"] = "half"
    half["status"]["devices"][1]["vramAllocatedBytes"] = "lots"
    view = summarise([broken, half, NODES[0]], [], [])
    assert [m.devices for m in view.models] == [2] and view.sick == []
    assert list(view.nodes) == ["gpu-a"]
    assert len(view.problems) == 2
    assert "'bad'" in view.problems[0] and "'half'" in view.problems[1]


def test_text() -> None:
    text = view_text(summarise(NODES, PODS, QUOTAS), SOURCE, ACU_TFLOPS, now=1767225900.0)
    lines = text.splitlines()
    assert lines[:5] == [
        "cluster:  https://api.example:6443 (context prod)",
        "nodes:    3 (1 Degraded, 1 NotReady, 1 Ready)",
        "devices:  5 (2 not healthy, 1 unusable: 64Gi VRAM and 100.3 ACU in the totals, "
        "not in free)",
        "vram:     104Gi allocated of 384Gi (216Gi free)",
        "acu:      150 reserved of 495.3 (245 free; measured 1/5; 1 ACU = 3.12 FP16 TFLOPS)",
    ]
    assert lines[6].split() == [
        "VENDOR", "MODEL", "NODES", "DEVICES", "NOT", "HEALTHY", "UNUSABLE", "VRAM",
        "USED/TOTAL", "FREE", "ACU", "USED/TOTAL", "ACU", "FROM",
    ]  # fmt: skip
    # the lost Ascend counts in the totals, never in free (the scheduler does not use it)
    assert lines[7].split() == [
        "ascend", "Ascend910B3", "1", "1", "1", "1", "0/64Gi", "0", "0/100.3", "profile",
    ]  # fmt: skip
    assert lines[8].split() == [
        "nvidia", "A100-SXM4-80GB", "2", "4", "1", "0", "104Gi/320Gi", "216Gi", "150/395",
        "measured", "1/4",
    ]  # fmt: skip
    assert (
        "gpu-b  nvidia/1  A100-SXM4-80GB  degraded  60     b-1   xid-48: double-bit ECC error"
        in text
    )
    big = next(line for line in lines if line.startswith("team       big"))
    assert big.split()[2:6] == ["ai.compute/vram=200Gi", "default-scheduler", "-", "5m"]
    assert big.endswith("Unschedulable: 0/3 nodes are available: 3 no device with 200Gi free.")
    assert "team       limits  16Gi/100Gi      -                      1/4" in text


def test_json_schema_is_stable() -> None:
    data = view_json(summarise(NODES, PODS, QUOTAS), SOURCE, ACU_TFLOPS)
    json.dumps(data)  # plain JSON types only
    assert set(data) == {
        "version", "source", "acu_tflops_fp16", "nodes", "totals", "models",
        "not_healthy_devices", "pending_pods", "quotas", "problems", "stale_nodes",
        "stale_totals", "heartbeats_checked", "pending_pods_shown", "pending_pods_namespace",
    }  # fmt: skip
    assert data["version"] == 1
    assert data["models"][1] == {
        "vendor": "nvidia",
        "model": "A100-SXM4-80GB",
        "nodes": ["gpu-a", "gpu-b"],
        "devices": 4,
        "not_healthy": 1,
        "vram_total_bytes": 320 * GiB,
        "vram_used_bytes": 104 * GiB,
        "vram_free_bytes": 216 * GiB,
        "acu_total": 395.0,
        "acu_used": 150.0,
        "acu_free": 245.0,
        "acu_source": "measured 1/4",
        "measured_devices": 1,
        "unusable_devices": 0,
        "unusable_vram_bytes": 0,
        "unusable_acu": 0.0,
    }
    ascend = data["models"][0]
    assert (ascend["vram_free_bytes"], ascend["acu_free"]) == (0, 0.0)
    assert (ascend["unusable_devices"], ascend["unusable_vram_bytes"]) == (1, 64 * GiB)
    assert (data["totals"]["vram_free_bytes"], data["totals"]["unusable_acu"]) == (216 * GiB, 100.3)
    assert data["not_healthy_devices"][0] == {
        "node": "gpu-b", "uuid": "b-1", "vendor": "nvidia", "index": 1,
        "model": "A100-SXM4-80GB", "health": "degraded", "health_score": 60,
        "reason": "xid-48: double-bit ECC error",
    }  # fmt: skip
    assert set(data["pending_pods"][0]) == {
        "namespace", "name", "asks", "scheduler", "node", "reason", "message", "created",
    }  # fmt: skip
    assert data["quotas"] == [
        {"namespace": "team", "name": "limits", "hard": {"vram": "100Gi", "devices": "4"},
         "used": {"vram": "16Gi", "tflops-fp16": "0", "devices": "1"}},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("explicit", "env", "home_config", "in_cluster", "expected"),
    [
        pytest.param("given", "a:b", True, False, "given", id="flag-first"),
        pytest.param(None, "missing:a", True, False, "a", id="env-skips-missing-files"),
        pytest.param(None, "", True, False, "home", id="home"),
        pytest.param(None, "", False, True, None, id="in-cluster"),
        pytest.param(None, "", False, False, "no kubeconfig: give --kubeconfig", id="none"),
        pytest.param(None, "missing", True, False, "none of the files", id="env-all-missing"),
        pytest.param("missing", "", True, False, "no kubeconfig at", id="flag-missing"),
    ],
)
def test_credentials_are_found_as_kubectl_finds_them(
    tmp_path: Path,
    explicit: str | None,
    env: str,
    home_config: bool,
    in_cluster: bool,
    expected: str | None,
) -> None:
    for name in ("given", "a", "b"):
        (tmp_path / name).write_text("{}")
    if home_config:
        (tmp_path / ".kube").mkdir()
        (tmp_path / ".kube" / "config").write_text("{}")
    environ = {"KUBECONFIG": ":".join(str(tmp_path / p) for p in env.split(":") if p)}
    if in_cluster:
        environ["KUBERNETES_SERVICE_HOST"] = "10.96.0.1"
    flag = str(tmp_path / explicit) if explicit else None
    if expected in (None, "given", "a", "home"):
        found = find_kubeconfig(flag, environ, tmp_path)
        want = {"home": str(tmp_path / ".kube" / "config"), None: None}.get(
            expected, str(tmp_path / str(expected))
        )
        assert found == want
    else:
        with pytest.raises(ViewError, match=str(expected)):
            find_kubeconfig(flag, environ, tmp_path)


def test_kubectl_hcs_is_the_cluster_command() -> None:
    parser = kubectl_hcs.build_parser()
    args = parser.parse_args(["cluster", "--json", "--context", "x"])
    assert (args.command, args.json, args.context) == ("cluster", True, "x")
    plain = parser.parse_args(["cluster"])
    assert not hasattr(plain, "json")  # cluster.run reads it with a default


def test_node_commands_do_not_load_the_kubernetes_client() -> None:
    """`hcsctl status` starts without the client (it costs ~0.3 s to import)."""
    code = (
        "import sys; from hcsd.cli import hcsctl; hcsctl.build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'urllib3')"
        " or m.startswith('hcsd.cluster')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def lease(node: str, renewed: str, duration: int = 40) -> dict[str, Any]:
    return {
        "metadata": {"name": f"hcs-node-{node}", "namespace": "hcs-system"},
        "spec": {"holderIdentity": node, "renewTime": renewed, "leaseDurationSeconds": duration},
    }


NOW = datetime.fromisoformat("2026-01-01T00:10:00+00:00").timestamp()


def test_nodes_without_a_live_heartbeat_are_stale_and_not_counted() -> None:
    """The extender's rule (heartbeats.stale_reason): a Lease older than its duration, or
    none, and the node takes no pod; the view counts it apart, with why."""
    unwritten = compute_node("fresh", node_spec(pb.Node(name="fresh"), [device("f-0", 0)]))
    leases = [
        lease("gpu-a", "2026-01-01T00:09:50.000000Z"),  # 10s old: live
        lease("gpu-b", "2026-01-01T00:05:00.000000Z"),  # 300s old: stale
        lease("fresh", "2026-01-01T00:09:59.000000Z"),  # live, but no status ever written
        {"metadata": {"name": "hcs-scheduler-leader"}, "spec": {}},  # not a heartbeat
    ]  # npu-a: no Lease at all
    view = summarise([*NODES, unwritten], [], [], leases, NOW)
    assert view.nodes == {"fresh": "stale", "gpu-a": "Ready", "gpu-b": "stale", "npu-a": "stale"}
    assert [(n.name, n.capacity.devices) for n in view.stale] == [
        ("fresh", 1), ("gpu-b", 2), ("npu-a", 1),
    ]  # fmt: skip
    assert "300s old (limit 40s)" in view.stale[1].reason
    assert "no hcs heartbeat Lease" in view.stale[2].reason
    assert "status never written" in view.stale[0].reason
    live = totals(view.models)
    assert (live.devices, live.vram_total, live.vram_free) == (2, 160 * GiB, 64 * GiB)
    assert live.acu_total == pytest.approx(200.0)
    text = view_text(view, SOURCE, ACU_TFLOPS, NOW)
    assert "stale:    3 nodes, 4 devices, 304Gi VRAM, 395.3 ACU: not counted above" in text
    assert "gpu-b  2        160Gi  195.0" not in text  # one decimal, .0 dropped
    assert "gpu-b  2        160Gi  195  " in text
    data = view_json(view, SOURCE, ACU_TFLOPS)
    assert data["totals"]["devices"] == 2 and data["stale_totals"]["devices"] == 4
    assert [(n["node"], n["devices"]) for n in data["stale_nodes"]] == [
        ("fresh", 1), ("gpu-b", 2), ("npu-a", 1),
    ]  # fmt: skip


def test_a_renewed_heartbeat_makes_the_node_live_again() -> None:
    leases = [lease(n, "2026-01-01T00:09:59Z") for n in ("gpu-a", "gpu-b", "npu-a")]
    view = summarise(NODES, [], [], leases, NOW)
    assert view.stale == [] and totals(view.models).devices == 5


@pytest.mark.parametrize(
    "value, text",
    [(3155 * 317.0, "1000135"), (1000137.46, "1000137.5"), (12.34, "12.3"), (100.0, "100"),
     (0.04, "0"), (0.0, "0")],
)  # fmt: skip
def test_acu_is_never_in_exponent_notation(value: float, text: str) -> None:
    assert cluster_tables._acu(value) == text


def test_text_escapes_what_others_wrote() -> None:
    """A reason or a pod message with control characters cannot drive the terminal or
    fake a row: C0, DEL, C1, newlines and bidi overrides are shown escaped."""
    nasty = "ecc\x1b[2J\nnpu-x  ascend/9  fake\x7f\x9b31m\u202eevil"
    node = synced(
        "gpu-x",
        [
            device(
                "x-0",
                0,
                health_state=pb.HEALTH_STATE_UNHEALTHY,
                health_score=0,
                attributes={"health_reason": nasty},
            )
        ],
    )
    refused = {
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "no\rroom\x07",
            }
        ]
    }
    pods = [pod("p\x1b]0;t\x07", limits={"ai.compute/vram": "1Gi"}, status=refused)]
    text = view_text(summarise([node], pods, []), SOURCE, ACU_TFLOPS, NOW)
    assert all(c.isprintable() or c == "\n" for c in text)
    assert "ecc\\x1b[2J\\nnpu-x  ascend/9  fake\\x7f\\x9b31m\\u202eevil" in text
    assert "Unschedulable: no\\rroom\\x07" in text
    assert "p\\x1b]0;t\\x07" in text


def test_a_long_reason_is_cut_to_the_crds_cap() -> None:
    """status.devices[].reason has a maxLength: a longer string would fail the whole status
    write, so the syncer cuts it to the CRD's cap."""
    crd = yaml.safe_load(
        (Path(__file__).parents[2] / "packaging/kubernetes/crds/computenodes.yaml").read_text()
    )
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    cap = status["properties"]["devices"]["items"]["properties"]["reason"]["maxLength"]
    long = device("l-0", 0, health_state=pb.HEALTH_STATE_UNHEALTHY,
                  attributes={"health_reason": "x" * 5000})  # fmt: skip
    written = node_status([long], [], previous={}, now="2026-01-01T00:00:00Z")
    assert written["devices"][0]["reason"] == "x" * cap and cap == REASON_MAX
