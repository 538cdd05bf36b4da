"""An OCI bundle as the runc wrapper and the OCI hook read and edit it, without runc: the
pod's identity from either runtime's annotations, what a config holds (malformed parts count
as absent), and edits that replace what they name and can be applied twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.frontends.bundle import (
    apply_edits,
    container_spec,
    is_sandbox,
    load_config,
    prepare_request,
    save_config,
)

CONTAINERD = {
    "io.kubernetes.cri.container-name": "main",
    "io.kubernetes.cri.sandbox-name": "trainer",
    "io.kubernetes.cri.sandbox-namespace": "team-a",
    "io.kubernetes.cri.sandbox-uid": "uid-1",
    "hcs.io/vram": "8Gi",
}
CRIO = {
    "io.kubernetes.container.name": "main",
    "io.kubernetes.pod.name": "trainer",
    "io.kubernetes.pod.namespace": "team-a",
    "io.kubernetes.pod.uid": "uid-1",
    "hcs.io/vram": "8Gi",
}

EDITS = pb.PrepareContainerResponse(
    devices=[pb.DeviceNode(path="/dev/nvidia0", type="c", major=195, minor=0)],
    env={"CUDA_VISIBLE_DEVICES": "GPU-0", "HCS_CONFIG": "/run/hcs/quota.conf"},
    mounts=[
        pb.Mount(
            container_path="/etc/ld.so.preload",
            host_path="/run/hcsd/ld.so.preload",
            options=["rbind", "ro"],
        )
    ],
)


@pytest.mark.parametrize("annotations", [CONTAINERD, CRIO], ids=["containerd", "cri-o"])
def test_the_pod_comes_from_either_runtimes_annotations(annotations: dict[str, str]) -> None:
    request = prepare_request("ctr-1", {"annotations": annotations}, "hcs-runtime")
    assert (request.container_id, request.container_name, request.front_end) == (
        "ctr-1",
        "main",
        "hcs-runtime",
    )
    assert (request.pod.namespace, request.pod.name, request.pod.uid) == (
        "team-a",
        "trainer",
        "uid-1",
    )
    assert request.container_annotations["hcs.io/vram"] == "8Gi"
    assert request.pod_annotations["hcs.io/vram"] == "8Gi"  # the bundle has one set of both


def test_a_bundle_without_kubernetes_annotations_is_a_bare_container() -> None:
    request = prepare_request("ctr-2", {"annotations": {"hcs.io/vram": "1Gi"}}, "hcs-oci-hook")
    assert request.container_name == "" and request.pod == pb.PodRef()


@pytest.mark.parametrize(
    ("annotations", "sandbox"),
    [
        pytest.param({"io.kubernetes.cri.container-type": "sandbox"}, True, id="containerd"),
        pytest.param({"io.kubernetes.cri-o.ContainerType": "sandbox"}, True, id="cri-o"),
        pytest.param({"io.kubernetes.cri.container-type": "container"}, False, id="container"),
        pytest.param({}, False, id="none"),
    ],
)
def test_pause_containers_are_recognised(annotations: dict[str, str], sandbox: bool) -> None:
    assert is_sandbox({"annotations": annotations}) is sandbox


def test_what_a_config_holds_and_malformed_parts_count_as_absent() -> None:
    config: dict[str, Any] = {
        "process": {"env": ["PATH=/bin", "HCS_CONFIG=/run/hcs/quota.conf"]},
        "mounts": [{"destination": "/etc/ld.so.preload", "source": "/x"}, "not a mount"],
        "linux": {"devices": [{"path": "/dev/nvidia0"}, 7]},
    }
    spec = container_spec(config)
    assert list(spec.device_paths) == ["/dev/nvidia0"]
    assert [(m.container_path, m.host_path) for m in spec.mounts] == [("/etc/ld.so.preload", "/x")]
    assert list(spec.env) == ["PATH=/bin", "HCS_CONFIG=/run/hcs/quota.conf"]
    for broken in ({"linux": "x", "process": 3}, {"linux": {"devices": None}}, {}):
        assert container_spec(broken) == pb.ContainerSpec()


def test_edits_replace_what_they_name_keep_the_rest_and_apply_twice_the_same() -> None:
    config: dict[str, Any] = {
        "process": {"env": ["PATH=/bin", "CUDA_VISIBLE_DEVICES=all"]},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/etc/ld.so.preload", "type": "bind", "source": "/image/preload"},
        ],
        "linux": {"devices": [{"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 3}]},
    }
    once = apply_edits(config, EDITS)
    assert once["process"]["env"] == [
        "PATH=/bin",
        "CUDA_VISIBLE_DEVICES=GPU-0",
        "HCS_CONFIG=/run/hcs/quota.conf",
    ]
    assert once["mounts"] == [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/etc/ld.so.preload",
            "type": "bind",
            "source": "/run/hcsd/ld.so.preload",
            "options": ["rbind", "ro"],
        },
    ]
    assert once["linux"]["devices"] == [
        {
            "path": "/dev/nvidia0",
            "type": "c",
            "major": 195,
            "minor": 0,
            "fileMode": 0o666,
            "uid": 0,
            "gid": 0,
        }
    ]
    rule = {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"}
    assert once["linux"]["resources"]["devices"] == [rule]
    snapshot = json.dumps(once, sort_keys=True)
    assert json.dumps(apply_edits(once, EDITS), sort_keys=True) == snapshot


def test_a_config_is_read_and_replaced_whole(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"ociVersion": "1.0.2"}))
    config = load_config(str(tmp_path))
    config["annotations"] = {"hcs.io/vram": "1Gi"}
    save_config(str(tmp_path), config)
    assert load_config(str(tmp_path)) == config
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]  # no temp file left
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="is not an OCI runtime config"):
        load_config(str(tmp_path))
