"""The chart with the real `helm`, no cluster: lint, what it renders for which values, and
packaging/kubernetes being what the chart renders (one source).

Skips loudly when helm cannot be had (tests/harness/peers/helm.py builds it from its Go
module into ~/.cache/hcs the first time: minutes).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hcsd.cluster.healer_cli import main as controller_main
from hcsd.cluster.webhook_server import MUTATE_PATH
from hcsd.cluster.webhook_server import main as webhook_main
from hcsd.contract import assignment
from hcsd.contract.names import TAINT_UNHEALTHY
from tests.harness.peers.helm import ensure_helm

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "packaging" / "helm" / "hcs"
IMAGE = ("--set", "image.repository=registry.example/hcs/hcs-cluster")  # required: no default


@pytest.fixture(scope="module")
def helm() -> str:
    found = ensure_helm()
    if isinstance(found, str):
        pytest.skip(f"SKIP chart tests: {found}")
    return str(found)


def run(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, check=False, timeout=120)


def template(helm: str, *values: str, chart: Path = CHART) -> list[dict[str, Any]]:
    done = run(helm, "template", "hcs", str(chart), "--namespace", "hcs-system", *IMAGE, *values)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def kinds(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


@pytest.mark.parametrize("strict", [False, True], ids=["lint", "lint --strict"])
def test_lint_is_clean(helm: str, strict: bool) -> None:
    """With the one value that has no default (image.repository)."""
    done = run(helm, "lint", *(["--strict"] if strict else []), str(CHART), *IMAGE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


def test_the_kustomize_tree_is_rendered_from_the_chart(helm: str) -> None:
    """`make manifests` has been run since the chart last changed."""
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "render-manifests"), "--helm", helm, "--check"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_crds_are_the_kustomize_trees_byte_for_byte() -> None:
    for crd in (CHART / "crds").iterdir():
        tree = REPO / "packaging" / "kubernetes" / "crds" / crd.name
        assert tree.read_bytes() == crd.read_bytes(), crd.name


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        (
            ["--set", "mode=dra", "--set", "dra.deviceTaintEffect=PreferNoSchedule"],
            "dra.deviceTaintEffect must be NoSchedule or NoExecute",
        ),
        (["--set", "mode=other"], 'mode: "other" is not a mode'),
        (["--set", "webhook.failurePolicy=Maybe"], "webhook.failurePolicy must be Fail or Ignore"),
        (["--set", "scheduler.enabled=false"], "which scheduler.enabled=false does not run"),
        (["--set", "webhook.tls.generate=false"], "needs webhook.tls.caBundle"),
        (
            ["--set", "webhook.networkPolicy.enabled=true"],
            "needs webhook.networkPolicy.apiServerCIDRs",
        ),
    ],
    ids=[
        "dra device taint effect",
        "unknown mode",
        "failure policy",
        "webhook without scheduler",
        "no caBundle",
        "webhook policy without the API server",
    ],
)
def test_values_that_cannot_work_are_refused(helm: str, values: list[str], reason: str) -> None:
    done = run(helm, "template", "hcs", str(CHART), *IMAGE, *values)
    assert done.returncode != 0 and reason in done.stderr, done.stderr


def test_the_scheduler_image_follows_the_clusters_release(helm: str) -> None:
    """A managed cluster's version carries a suffix upstream's images do not."""
    docs = template(helm, "--kube-version", "v1.33.5-eks-3025e55")
    (scheduler,) = [
        d for d in docs if (d["kind"], d["metadata"]["name"]) == ("Deployment", "hcs-scheduler")
    ]
    (container,) = scheduler["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.k8s.io/kube-scheduler:v1.33.5"
    docs = template(helm, "--kube-version", "v1.33.5", "--set", "scheduler.image.tag=v1.33.1")
    (scheduler,) = [
        d for d in docs if (d["kind"], d["metadata"]["name"]) == ("Deployment", "hcs-scheduler")
    ]
    assert scheduler["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":v1.33.1")


def test_bring_your_own_secrets_renders_none(helm: str) -> None:
    docs = template(
        helm,
        "--set", "assignmentKeys.generate=false", "--set", "extender.tls.generate=false",
        "--set", "webhook.tls.generate=false", "--set", "webhook.tls.caBundle=Q0E=",
    )  # fmt: skip
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert ("ConfigMap", "hcs-node-keys-ca") not in kinds(docs)
    (config,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    assert config["webhooks"][0]["clientConfig"]["caBundle"] == "Q0E="


def test_keep_secrets_annotates_the_keys_only(helm: str) -> None:
    docs = template(helm, "--set", "keepSecrets=true")
    kept = [
        d["metadata"]["name"]
        for d in docs
        if (d["metadata"].get("annotations") or {}).get("helm.sh/resource-policy") == "keep"
    ]
    assert kept == ["hcs-assignment-key"]


def test_monitoring_objects_render_only_when_asked_and_when_the_files_exist(
    helm: str, tmp_path: Path
) -> None:
    everything = ["--set", "monitoring.serviceMonitor.enabled=true",
                  "--set", "monitoring.podMonitor.enabled=true",
                  "--set", "monitoring.rules.enabled=true",
                  "--set", "monitoring.dashboard.enabled=true"]  # fmt: skip
    assert not {"ServiceMonitor", "PodMonitor", "PrometheusRule"} & {
        d["kind"] for d in template(helm)
    }
    chart = tmp_path / "hcs"
    shutil.copytree(CHART, chart)
    for name in ("prometheus-rules.yaml", "dashboard.json"):
        (chart / "files" / name).unlink(missing_ok=True)
    without_files = {d["kind"] for d in template(helm, *everything, chart=chart)}
    assert {"ServiceMonitor", "PodMonitor"} <= without_files
    assert "PrometheusRule" not in without_files
    assert ("ConfigMap", "hcs-dashboard") not in kinds(template(helm, *everything, chart=chart))
    rules = {"groups": [{"name": "hcs", "rules": [{"alert": "X", "expr": "up == 0"}]}]}
    (chart / "files" / "prometheus-rules.yaml").write_text(yaml.safe_dump(rules))
    (chart / "files" / "dashboard.json").write_text('{"title": "HCS"}\n')
    docs = template(helm, *everything, chart=chart)
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["spec"] == rules
    (dashboard,) = [d for d in docs if d["metadata"]["name"] == "hcs-dashboard"]
    assert dashboard["data"] == {"hcs-overview.json": '{"title": "HCS"}\n'}
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_the_webhook_is_called_only_for_pods_outside_kube_system_and_ours(helm: str) -> None:
    docs = template(helm, "--set", "webhook.excludedNamespaces={batch}")
    (config,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    (hook,) = config["webhooks"]
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
    assert hook["rules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
         "resources": ["pods"], "scope": "Namespaced"}
    ]  # fmt: skip
    names, opt_out = hook["namespaceSelector"]["matchExpressions"]
    assert names["operator"] == "NotIn" and names["values"] == [
        "kube-system",
        "hcs-system",
        "batch",
    ]
    assert opt_out == {"key": "hcs.io/webhook", "operator": "NotIn", "values": ["disabled"]}
    assert hook["objectSelector"]["matchExpressions"] == [opt_out]
    assert "ai.compute/" in hook["matchConditions"][0]["expression"]


def test_the_webhook_runs_with_flags_its_program_knows(
    helm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Deployment's command through hcs-admission-webhook's own parser: a misspelt flag
    fails here rather than in a crash-looping pod; the port, files and name agree."""
    docs = template(helm)
    (deployment,) = [
        d
        for d in docs
        if (d["kind"], d["metadata"]["name"]) == ("Deployment", "hcs-admission-webhook")
    ]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"][0] == "hcs-admission-webhook"
    parsed: list[argparse.Namespace] = []
    original = argparse.ArgumentParser.parse_args

    def stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> argparse.Namespace:
        parsed.append(original(self, *args, **kwargs))
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    with pytest.raises(SystemExit):
        webhook_main(container["command"][1:])
    (args,) = parsed
    assert args.scheduler_name == "hcs-scheduler"
    port = int(args.listen.rpartition(":")[2])
    assert container["ports"] == [{"name": "https", "containerPort": port}]
    assert container["readinessProbe"]["httpGet"] == {
        "path": "/healthz",
        "port": port,
        "scheme": "HTTPS",
    }
    (mount,) = container["volumeMounts"]
    assert Path(args.tls_cert).parent == Path(args.tls_key).parent == Path(mount["mountPath"])
    (service,) = [
        d
        for d in docs
        if (d["kind"], d["metadata"]["name"]) == ("Service", "hcs-admission-webhook")
    ]
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": port}]
    (config,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    assert config["webhooks"][0]["clientConfig"]["service"]["path"] == MUTATE_PATH
    assert pod["automountServiceAccountToken"] is False  # it calls no API


def test_in_dra_mode_the_webhook_may_make_claim_templates_and_read_for_quotas_only(
    helm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mode: dra gives the webhook `--mode dra`, a token, and a ClusterRole with get and
    create on resourceclaimtemplates (list: the quota reads pending pods' templates), reads
    for the ComputeQuota and get on runtimeprofiles
    only; its configuration says NoneOnDryRun."""
    docs = template(helm, "--set", "mode=dra")
    (deployment,) = [
        d
        for d in docs
        if (d["kind"], d["metadata"]["name"]) == ("Deployment", "hcs-admission-webhook")
    ]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    parsed: list[argparse.Namespace] = []
    original = argparse.ArgumentParser.parse_args

    def stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> argparse.Namespace:
        parsed.append(original(self, *args, **kwargs))
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    with pytest.raises(SystemExit):
        webhook_main(pod["containers"][0]["command"][1:])
    assert parsed[0].mode == "dra"
    (role,) = [
        d
        for d in docs
        if (d["kind"], d["metadata"]["name"]) == ("ClusterRole", "hcs-admission-webhook")
    ]
    assert role["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"],
         "verbs": ["get", "list", "create"]},
        # ComputeQuota at admission (claim_quota.py): reads only, of what the rule counts
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": ["hcs.io"], "resources": ["computequotas"], "verbs": ["list"]},
        {"apiGroups": ["hcs.io"], "resources": ["computenodes"], "verbs": ["get", "list"]},
        {"apiGroups": ["hcs.io"], "resources": ["runtimeprofiles"], "verbs": ["get"]},
    ]  # fmt: skip
    (binding,) = [
        d
        for d in docs
        if (d["kind"], d["metadata"]["name"]) == ("ClusterRoleBinding", "hcs-admission-webhook")
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "hcs-admission-webhook", "namespace": "hcs-system"}
    ]
    (config,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    assert config["webhooks"][0]["sideEffects"] == "NoneOnDryRun"
    extender = template(helm)
    assert ("ClusterRole", "hcs-admission-webhook") not in kinds(extender)
    # The webhook sends no pod to hcs-scheduler in DRA mode: it may run without it.
    assert ("Deployment", "hcs-admission-webhook") in kinds(
        template(helm, "--set", "mode=dra", "--set", "scheduler.enabled=false")
    )


def controller_args(
    helm: str, monkeypatch: pytest.MonkeyPatch, *values: str
) -> tuple[argparse.Namespace, dict[str, Any]]:
    """hcs-controller's Deployment command through its own parser (a misspelt flag fails
    here rather than in a crash-looping pod), and its container."""
    (deployment,) = [
        d
        for d in template(helm, *values)
        if (d["kind"], d["metadata"]["name"]) == ("Deployment", "hcs-controller")
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"][0] == "hcs-controller"
    parsed: list[argparse.Namespace] = []
    original = argparse.ArgumentParser.parse_args

    def stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> argparse.Namespace:
        parsed.append(original(self, *args, **kwargs))
        raise SystemExit(0)

    with monkeypatch.context() as patched, pytest.raises(SystemExit):
        patched.setattr(argparse.ArgumentParser, "parse_args", stop)
        controller_main(container["command"][1:])
    return parsed[0], container


def test_the_controller_runs_with_flags_its_program_knows_from_its_values(
    helm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    args, container = controller_args(helm, monkeypatch)
    assert (args.namespace, args.taint_effect, args.taint_share) == (
        "hcs-system",
        "NoSchedule",
        1.0,
    )
    assert (args.quiet_seconds, args.eviction_grace_seconds) == (300.0, -1)
    assert (args.isolate_degraded, args.slow_margin, args.slow_min_devices) == (False, 0.15, 3)
    port = int(args.probe_listen.rpartition(":")[2])
    assert container["ports"] == [{"name": "probes", "containerPort": port}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    args, _ = controller_args(
        helm, monkeypatch,
        "--set", "controller.taintEffect=NoExecute", "--set", "controller.taintShare=0.5",
        "--set", "controller.isolateDegraded=true", "--set", "controller.evictionGraceSeconds=30",
        "--set", "controller.quietSeconds=60",
    )  # fmt: skip
    assert (args.taint_effect, args.taint_share, args.isolate_degraded) == ("NoExecute", 0.5, True)
    assert (args.eviction_grace_seconds, args.quiet_seconds) == (30, 60.0)


def test_the_controller_can_be_left_out(helm: str) -> None:
    names = {d["metadata"]["name"] for d in template(helm, "--set", "controller.enabled=false")}
    assert "hcs-controller" not in names
    assert "hcs-controller" in {d["metadata"]["name"] for d in template(helm)}


def test_the_webhook_survives_a_drain_and_admits_only_the_api_server_when_asked(helm: str) -> None:
    """More than one replica: spread over nodes and a PodDisruptionBudget keeping one; the
    optional NetworkPolicy admits the control plane and the probes to port 8443 alone."""
    docs = template(helm)
    (budget,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert budget["spec"]["minAvailable"] == 1
    (deployment,) = [
        d
        for d in docs
        if (d["kind"], d["metadata"]["name"]) == ("Deployment", "hcs-admission-webhook")
    ]
    (spread,) = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["whenUnsatisfiable"] == "DoNotSchedule"
    assert spread["labelSelector"] == budget["spec"]["selector"]
    assert ("NetworkPolicy", "hcs-admission-webhook") not in kinds(docs)
    single = template(helm, "--set", "webhook.replicas=1")
    assert not [d for d in single if d["kind"] == "PodDisruptionBudget"]
    docs = template(
        helm, "--set", "webhook.networkPolicy.enabled=true",
        "--set", "webhook.networkPolicy.apiServerCIDRs={10.0.0.10/32}",
        "--set", "webhook.networkPolicy.nodeCIDRs={10.1.0.0/16}",
    )  # fmt: skip
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8443}]
    assert [f["ipBlock"]["cidr"] for f in rule["from"]] == ["10.0.0.10/32", "10.1.0.0/16"]


def test_the_image_must_be_named_and_can_be_pinned_by_digest(helm: str) -> None:
    """HCS publishes no image: no default name someone else could own is ever pulled."""
    done = run(helm, "template", "hcs", str(CHART))
    assert done.returncode != 0
    assert "image.repository is required: HCS publishes no image" in done.stderr
    assert "make image" in done.stderr and "docs/images.md" in done.stderr
    digest = "sha256:" + "0123456789abcdef" * 4
    docs = template(helm, "--set", f"image.digest={digest}")
    images = {
        c["image"]
        for d in docs
        if d["kind"] in {"Deployment", "DaemonSet"}
        for c in d["spec"]["template"]["spec"]["containers"]
        if "kube-scheduler" not in c["image"]
    }
    assert images == {f"registry.example/hcs/hcs-cluster@{digest}"}
    done = run(helm, "template", "hcs", str(CHART), *IMAGE, "--set", "image.digest=latest")
    assert done.returncode != 0 and "image.digest must be sha256:" in done.stderr


def test_hcs_scheduler_and_the_extender_can_be_kept_on_system_nodes(helm: str) -> None:
    term = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}
    affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    role = "node-role.kubernetes.io/control-plane"
    toleration = {"key": role, "operator": "Exists", "effect": "NoSchedule"}
    values = []
    for part in ("scheduler", "extender"):
        values += ["--set-json", f"{part}.nodeAffinity={json.dumps(affinity)}",
                   "--set-json", f"{part}.nodeSelector={json.dumps({role: ''})}",
                   "--set-json", f"{part}.tolerations={json.dumps([toleration])}"]  # fmt: skip
    docs = template(helm, *values)
    for name in ("hcs-scheduler", "hcs-scheduler-extender"):
        (deployment,) = [
            d for d in docs if (d["kind"], d["metadata"]["name"]) == ("Deployment", name)
        ]
        pod = deployment["spec"]["template"]["spec"]
        assert pod["affinity"]["nodeAffinity"] == affinity, name
        assert "podAntiAffinity" in pod["affinity"], name  # the spread is kept
        assert pod["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
        assert pod["tolerations"] == [toleration]


def test_a_generated_key_has_a_random_id_and_an_existing_secret_is_used_as_it_is(
    helm: str,
) -> None:
    """Where lookup sees nothing (helm template, GitOps) every render makes a new key: under
    a fixed id (k1) it would replace the key the nodes hold for that id."""
    kids = []
    for _ in range(2):
        (secret,) = [
            d
            for d in template(helm)
            if (d["kind"], d["metadata"]["name"]) == ("Secret", "hcs-assignment-key")
        ]
        kid = base64.b64decode(secret["data"]["signing"]).decode()
        assert re.fullmatch(r"k-[0-9a-f]{8}", kid) and assignment.KID.fullmatch(kid)
        assert sorted(secret["data"]) == [f"{kid}.key", "signing"]
        kids.append(kid)
    assert kids[0] != kids[1]
    docs = template(helm, "--set", "assignmentKeys.existingSecret=my-keys")
    assert ("Secret", "hcs-assignment-key") not in kinds(docs)
    (extender,) = [
        d
        for d in docs
        if (d["kind"], d["metadata"]["name"]) == ("Deployment", "hcs-scheduler-extender")
    ]
    secrets = {
        v["secret"]["secretName"]
        for v in extender["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }
    assert "my-keys" in secrets and "hcs-assignment-key" not in secrets


def test_the_pods_carry_a_checksum_of_the_certificates_they_mount(helm: str) -> None:
    """kube-scheduler reads its caFile once: a renewed CA must roll hcs-scheduler's pods, so
    its template carries the client Secret's checksum (the extender's, its serving one's),
    computed from the very certificates rendered beside them."""
    docs = template(helm)

    def named(kind: str, name: str) -> dict[str, Any]:
        (found,) = [d for d in docs if (d["kind"], d["metadata"]["name"]) == (kind, name)]
        return found

    for deployment, secret in (
        ("hcs-scheduler", "hcs-scheduler-client-tls"),
        ("hcs-scheduler-extender", "hcs-scheduler-extender-tls"),
    ):
        data = named("Secret", secret)["data"]
        expected = hashlib.sha256(
            json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()[:16]
        annotations = named("Deployment", deployment)["spec"]["template"]["metadata"]
        assert annotations["annotations"]["checksum/tls"] == expected, deployment
    client = named("Secret", "hcs-scheduler-client-tls")["data"]
    assert base64.b64decode(client["common-name"]) == b"hcs-scheduler"
    mine = template(helm, "--set", "extender.tls.generate=false")
    pod = [
        d for d in mine if d["metadata"]["name"] == "hcs-scheduler" and d["kind"] == "Deployment"
    ]
    assert "checksum/tls" not in pod[0]["spec"]["template"]["metadata"]["annotations"]


def test_a_quota_admits_the_critical_priority_classes_in_the_namespace(helm: str) -> None:
    """GKE admits system-node-critical and system-cluster-critical pods outside kube-system
    only in a namespace whose ResourceQuota covers those classes."""
    docs = template(helm)
    (quota,) = [d for d in docs if d["kind"] == "ResourceQuota"]
    assert quota["metadata"]["namespace"] == "hcs-system"
    (selector,) = quota["spec"]["scopeSelector"]["matchExpressions"]
    classes = {
        d["spec"]["template"]["spec"].get("priorityClassName")
        for d in docs
        if d["kind"] in {"Deployment", "DaemonSet"}
    }
    assert selector["scopeName"] == "PriorityClass" and selector["operator"] == "In"
    assert classes == set(selector["values"])
    assert quota["spec"]["hard"] == {"pods": "1G"}
    docs = template(helm, "--set", "criticalPodsQuota.enabled=false")
    assert not [d for d in docs if d["kind"] == "ResourceQuota"]


def test_every_container_runs_under_the_runtimes_seccomp_profile(helm: str) -> None:
    docs = template(helm, "--set", "createNamespace=true")
    containers = [
        (d["metadata"]["name"], c)
        for d in docs
        if d["kind"] in {"Deployment", "DaemonSet"}
        for c in d["spec"]["template"]["spec"]["containers"]
    ]
    assert len(containers) == 5
    for name, container in containers:
        assert container["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
    (namespace,) = [d for d in docs if d["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_clusters_without_kube_proxy_get_host_network_addresses_and_ports(helm: str) -> None:
    """The values for clusters without kube-proxy/cluster DNS change what they name and
    nothing when left alone (test_the_kustomize_tree_is_rendered_from_the_chart holds the
    defaults to the shipped tree)."""
    import base64

    docs = template(
        helm, "--set", "hostNetwork=true", "--set", "kubernetesAPI.host=10.0.0.1",
        "--set", "kubernetesAPI.port=6443", "--set", "extenderAddress=10.0.0.5",
        "--set", "ports.extender=18888", "--set", "ports.extenderNodeKeys=18890",
        "--set", "ports.webhook=18443", "--set", "ports.scheduler=11259",
    )  # fmt: skip
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs
            if d["kind"] in ("Deployment", "DaemonSet")}  # fmt: skip
    assert set(pods) == {"hcs-syncer", "hcs-scheduler-extender", "hcs-admission-webhook",
                         "hcs-scheduler", "hcs-controller"}  # fmt: skip
    api = [{"name": "KUBERNETES_SERVICE_HOST", "value": "10.0.0.1"},
           {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}]  # fmt: skip
    for name, pod in pods.items():
        assert pod["hostNetwork"] is True, name
        env = pod["containers"][0].get("env", [])
        assert (env[-2:] == api) == (name != "hcs-admission-webhook"), (name, env)
    syncer = pods["hcs-syncer"]["containers"][0]["command"]
    assert syncer[syncer.index("--node-keys-url") + 1] == "https://10.0.0.5:18890/node-keys"
    (config,) = [d for d in docs if d["metadata"]["name"] == "hcs-scheduler-config"]
    scheduler = yaml.safe_load(config["data"]["config.yaml"])
    assert scheduler["extenders"][0]["urlPrefix"] == "https://10.0.0.5:18888/"
    assert "--secure-port=11259" in pods["hcs-scheduler"]["containers"][0]["command"]
    assert "0.0.0.0:18443" in pods["hcs-admission-webhook"]["containers"][0]["command"]
    (secret,) = [d for d in docs if d["metadata"]["name"] == "hcs-scheduler-extender-tls"]
    shown = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName"],
        input=base64.b64decode(secret["data"]["tls.crt"]), capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    assert "IP Address:10.0.0.5" in shown and "DNS:hcs-scheduler-extender.hcs-system.svc" in shown
    defaults = [d for d in template(helm) if d["kind"] in ("Deployment", "DaemonSet")]
    for doc in defaults:
        pod = doc["spec"]["template"]["spec"]
        assert "hostNetwork" not in pod, doc["metadata"]["name"]
        env = pod["containers"][0].get("env", [])
        assert not any(e["name"].startswith("KUBERNETES_") for e in env), env


def test_requeue_off_drops_the_patch_verb_and_its_policy_together(helm: str) -> None:
    """`patch pods` is safe only with the policy hcs-extender-requeue: the two come and go
    together, and the extender is told not to touch; on, it gets its pod's name and namespace
    for the guard's probe (hcsd/cluster/requeue_guard.py)."""

    def shape(docs: list[dict[str, Any]]) -> tuple[list[str], bool, list[str], set[str]]:
        (role,) = [d for d in docs if (d["kind"], d["metadata"]["name"]) == (
            "ClusterRole", "hcs-scheduler-extender")]  # fmt: skip
        (pods,) = [r for r in role["rules"] if r["resources"] == ["pods"]]
        (deployment,) = [d for d in docs if (d["kind"], d["metadata"]["name"]) == (
            "Deployment", "hcs-scheduler-extender")]  # fmt: skip
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        policy = ("ValidatingAdmissionPolicy", "hcs-extender-requeue") in kinds(docs)
        return pods["verbs"], policy, container["command"], {e["name"] for e in container["env"]}

    verbs, policy, command, env = shape(template(helm))
    assert "patch" in verbs and policy and "--no-requeue" not in command
    assert {"POD_NAME", "POD_NAMESPACE"} <= env
    off = ("--set", "requeue.enabled=false", "--set", "runtimeProfiles.enabled=false")
    verbs, policy, command, _ = shape(template(helm, *off))
    assert "patch" not in verbs and not policy and "--no-requeue" in command


def profile_rules(docs: list[dict[str, Any]]) -> tuple[list[str], list[str], list[str]]:
    """What the extender and hcs-viewer may do on hcs.io, and the extender's command."""
    found = {}
    for name in ("hcs-scheduler-extender", "hcs-viewer"):
        (role,) = [d for d in docs if (d["kind"], d["metadata"]["name"]) == ("ClusterRole", name)]
        (rule,) = [r for r in role["rules"] if r["apiGroups"] == ["hcs.io"]
                   and "computenodes" in r["resources"]]  # fmt: skip
        found[name] = rule["resources"]
    (deployment,) = [d for d in docs if (d["kind"], d["metadata"]["name"]) == (
        "Deployment", "hcs-scheduler-extender")]  # fmt: skip
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return found["hcs-scheduler-extender"], found["hcs-viewer"], container["command"]


def test_runtime_profiles_are_on_by_default_and_off_drops_their_rbac(helm: str) -> None:
    """On (the default): the extender and hcs-viewer read RuntimeProfiles and the extender
    lists them; off: neither role names them and the extender is told so."""
    extender, viewer, command = profile_rules(template(helm))
    assert "runtimeprofiles" in extender and "runtimeprofiles" in viewer
    assert "--no-runtime-profiles" not in command
    extender, viewer, command = profile_rules(
        template(helm, "--set", "runtimeProfiles.enabled=false")
    )
    assert "runtimeprofiles" not in extender and "runtimeprofiles" not in viewer
    assert "--no-runtime-profiles" in command
    assert extender == ["computenodes", "computequotas"]


def test_runtime_profiles_follow_requeue_unless_set(helm: str) -> None:
    """Unset (auto): an install that turned requeue off upgrades with profiles off rather than
    failing; explicitly on, they are on whatever mode dra's requeue says."""
    extender, viewer, command = profile_rules(template(helm, "--set", "requeue.enabled=false"))
    assert "runtimeprofiles" not in extender and "runtimeprofiles" not in viewer
    assert "--no-runtime-profiles" in command and "--no-requeue" in command
    extender, _, command = profile_rules(
        template(helm, "--set", "requeue.enabled=false", "--set", "runtimeProfiles.enabled=false")
    )
    assert "runtimeprofiles" not in extender and "--no-runtime-profiles" in command
    extender, _, command = profile_rules(template(helm, "--set", "runtimeProfiles.enabled=true"))
    assert "runtimeprofiles" in extender and "--no-runtime-profiles" not in command


def test_runtime_profiles_set_on_without_requeue_are_refused_saying_why(helm: str) -> None:
    """Rebinding sets images with requeue's `patch pods` and policy: the pair cannot work."""
    done = run(
        helm, "template", "hcs", str(CHART), *IMAGE,
        "--set", "requeue.enabled=false", "--set", "runtimeProfiles.enabled=true",
    )  # fmt: skip
    assert done.returncode != 0
    assert "runtimeProfiles.enabled needs requeue.enabled" in done.stderr, done.stderr


def test_hcs_own_deployments_tolerate_the_unhealthy_taint(helm: str) -> None:
    """A NoExecute hcs.io/accelerator-unhealthy on the node must not delete HCS's own pods."""
    docs = template(helm, "--set", "webhook.enabled=true")
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    for name in ("hcs-scheduler-extender", "hcs-admission-webhook", "hcs-controller",
                 "hcs-scheduler"):  # fmt: skip
        tolerations = deployments[name]["spec"]["template"]["spec"].get("tolerations") or []
        assert {"key": TAINT_UNHEALTHY, "operator": "Exists"} in tolerations, name


@pytest.mark.parametrize("mode", ["extender", "dra"])
def test_checksum_annotations_are_quoted_strings(helm: str, mode: str) -> None:
    """A checksum annotation is 16 hex digits, which YAML reads as a number when they happen
    to be all decimal digits (or `<digits>e<digits>`): the API server then refuses the whole
    install (`annotations.checksum/tls: expected string`). Every one is rendered quoted."""
    done = run(helm, "template", "hcs", str(CHART), "--namespace", "hcs-system", *IMAGE,
               "--set", f"mode={mode}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines() if "checksum/" in line]
    quoted = re.compile(r'checksum/[a-z]+: "[0-9a-f]{16}"($| +#)')
    assert lines and all(quoted.match(line) for line in lines), lines
