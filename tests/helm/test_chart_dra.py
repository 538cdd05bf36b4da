"""The chart's `mode: dra` with the real `helm`, no cluster: the DeviceClasses (names and
selectors spelt as hcsd.contract.dra spells them, one per model of the profile database),
the syncers' flags, and that the extender mode renders none of it.
tests/cluster/test_dra_slices.py applies the same objects to a real API server."""

from __future__ import annotations

import argparse
import os
from typing import Any

import pytest

from hcsd.cluster.commands import syncer_main
from hcsd.cluster.kubeletplugin.plugin import PluginPaths
from hcsd.contract import dra
from hcsd.profiles.database import default_database
from tests.helm.test_chart import CHART, IMAGE, helm, run, template

__all__ = ["helm"]  # the fixture, shared with test_chart

DRA = ("--set", "mode=dra")


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def syncer_args(docs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """The DaemonSet's command through hcs-syncer's own parser."""
    (daemonset,) = by_kind(docs, "DaemonSet").values()
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["command"][0] == "hcs-syncer"
    parsed: list[argparse.Namespace] = []
    original = argparse.ArgumentParser.parse_args

    def stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> argparse.Namespace:
        parsed.append(original(self, *args, **kwargs))
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    with pytest.raises(SystemExit):
        syncer_main(container["command"][1:])
    monkeypatch.undo()
    return parsed[0]


def test_one_class_per_model_of_the_profile_database_per_vendor_and_for_any(helm: str) -> None:
    classes = by_kind(template(helm, *DRA), "DeviceClass")
    profiles = default_database().profiles
    vendors = {str(p.vendor) for p in profiles}
    want = (
        {dra.CLASS_ANY}
        | {dra.vendor_class(v) for v in vendors}
        | {dra.model_class(str(p.vendor), p.model) for p in profiles}
    )
    assert set(classes) == want
    attributes = f'device.attributes["{dra.DRIVER}"]'
    assert classes[dra.CLASS_ANY]["spec"]["selectors"] == [
        {"cel": {"expression": f'device.driver == "{dra.DRIVER}"'}}
    ]
    (nvidia,) = classes[dra.vendor_class("nvidia")]["spec"]["selectors"]
    assert nvidia["cel"]["expression"] == (
        f'device.driver == "{dra.DRIVER}" && {attributes}.{dra.ATTR_VENDOR} == "nvidia"'
    )
    (a100,) = classes[dra.model_class("nvidia", "A100-SXM4-80GB")]["spec"]["selectors"]
    assert a100["cel"]["expression"].endswith(
        f'&& {attributes}.{dra.ATTR_MODEL} == "A100-SXM4-80GB"'
    )


def test_the_syncers_publish_slices_with_the_taint_effect_asked_for(
    helm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = syncer_args(template(helm, *DRA), monkeypatch)
    assert (args.mode, args.device_taint_effect) == (dra.MODE_DRA, "NoSchedule")
    docs = template(helm, *DRA, "--set", "dra.deviceTaintEffect=NoExecute")
    assert syncer_args(docs, monkeypatch).device_taint_effect == "NoExecute"


def test_the_syncers_serve_kubelets_plugin_at_the_host_paths_kubelet_dials(
    helm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kubelet dials the endpoint the plugin names, so the sockets' directories are mounted at
    their host paths; the pod's uid comes from the downward API (rolling-update names). The
    claims' CDI specs and quota files are hcsd's, written on the host: not mounted here."""
    extender = template(helm)
    assert not syncer_args(extender, monkeypatch).kubelet_plugin
    for values in ((), ("--set", "dra.kubeletDir=/data/kubelet")):
        docs = template(helm, *DRA, *values)
        args = syncer_args(docs, monkeypatch)
        assert args.kubelet_plugin
        (daemonset,) = by_kind(docs, "DaemonSet").values()
        pod = daemonset["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}} in (
            container["env"]
        )
        paths = PluginPaths.of(args.kubelet_dir, "some-uid")
        assert args.kubelet_dir == (values[1].split("=")[1] if values else "/var/lib/kubelet")
        host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        for socket in (paths.registration, paths.endpoint):
            mount = mounts[os.path.dirname(socket)]
            assert host[mount["name"]] == mount["mountPath"]
            assert not mount.get("readOnly")
        assert not any(m.startswith(("/var/run/cdi", "/run/hcsd/claims")) for m in mounts)


def test_the_syncer_may_manage_resource_slices_only_in_dra_mode(
    helm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    extender = template(helm)
    assert not by_kind(extender, "DeviceClass")
    assert "hcs-syncer-resourceslices" not in by_kind(extender, "ClusterRole")
    assert "hcs-syncer-own-slice" not in by_kind(extender, "ValidatingAdmissionPolicy")
    assert syncer_args(extender, monkeypatch).mode == dra.MODE_EXTENDER
    docs = template(helm, *DRA)
    (rule,) = by_kind(docs, "ClusterRole")["hcs-syncer-resourceslices"]["rules"]
    assert rule == {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceslices"],
        "verbs": ["get", "create", "update"],  # what slice_publisher.py calls
    }
    rules = by_kind(docs, "ClusterRole")["hcs-scheduler-extender-resourceclaims"]["rules"]
    assert rules == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
         "verbs": ["list", "watch"]},  # claim_usage.py's informer
        # profile_gate_controller.py: the free capacity, a gated pod's template
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"],
         "verbs": ["get"]},
    ]  # fmt: skip
    extender_command = by_kind(docs, "Deployment")["hcs-scheduler-extender"]["spec"]["template"][
        "spec"
    ]["containers"][0]["command"]
    assert "--count-claims" in extender_command and "--profile-gate" in extender_command
    assert (
        "--count-claims"
        not in (
            by_kind(extender, "Deployment")["hcs-scheduler-extender"]["spec"]["template"]["spec"][
                "containers"
            ][0]["command"]
        )
    )
    policy = by_kind(docs, "ValidatingAdmissionPolicy")["hcs-syncer-own-slice"]
    binding = by_kind(docs, "ValidatingAdmissionPolicyBinding")["hcs-syncer-own-slice"]
    assert binding["spec"] == {"policyName": "hcs-syncer-own-slice", "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"


def notes(helm: str, *values: str) -> str:
    """The chart's NOTES.txt as `helm install` prints it (a client-side dry run)."""
    done = run(helm, "install", "hcs", str(CHART), "--namespace", "hcs-system",
               "--dry-run=client", *IMAGE, *values)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.split("NOTES:", 1)[1]


def test_the_notes_warn_of_a_dra_webhook_any_pod_can_reach(helm: str) -> None:
    warning = "WARNING: mode dra without webhook.networkPolicy.enabled"
    assert warning in notes(helm, *DRA)
    closed = ("--set", "webhook.networkPolicy.enabled=true",
              "--set", "webhook.networkPolicy.apiServerCIDRs={10.0.0.1/32}")  # fmt: skip
    assert warning not in notes(helm, *DRA, *closed)
    assert warning not in notes(helm)  # extender mode: a caller gains a scheduler name only
