"""The real Kubernetes of the cluster tests, built from the `k8s.io/kubernetes` Go module at a
pinned release: the control plane (kube-apiserver, kube-scheduler; Debian's etcd) and, for the
real-kubelet cluster, the node side (kubelet, kube-controller-manager, kubectl).

`k8s.io/kubernetes` cannot be `go install`ed: its go.mod replaces every `k8s.io/<staging>`
module with a directory of its own tree. So a small main module of ours requires it and
replaces each staging module with its published `v0.<minor>.<patch>` tag; the list of staging
modules is read from the release's own go.mod at build time, so a version bump needs no edit
here. The control plane is cached under `~/.cache/hcs/peers/kubernetes-<version>/` (a cold
build is ~10 minutes on 2 cores; the Go cache grows by ~5 GB), the node side apart under
`kubernetes-node-<version>/` (~3 minutes with the control plane's Go cache warm), so that
adding it rebuilt nothing. The node side carries the release in its version stamp (kubelet
reports it to the API server, kubectl prints it): without the ldflags they say v0.0.0-master.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.harness.peers.building import (
    Build,
    Log,
    cached,
    download_module,
    go_env,
    run_go,
    say,
)

KUBERNETES_VERSION = os.environ.get("HCS_KUBERNETES_VERSION", "v1.36.3")
ETCD_CANDIDATES = ("/usr/bin/etcd", "/usr/local/bin/etcd")
COMMANDS = ("kube-apiserver", "kube-scheduler")
NODE_COMMANDS = ("kubelet", "kube-controller-manager", "kubectl")


def _staging_modules(go: str, version: str) -> list[str] | str:
    """The `k8s.io/*` modules the release replaces with directories of its own tree."""
    found = download_module(go, "k8s.io/kubernetes", version)
    if isinstance(found, str):
        return found
    gomod = Path(found["GoMod"]).read_text()
    staged = re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", gomod, re.MULTILINE)
    return sorted(set(staged)) or "no staging replaces found in the release's go.mod"


def _main_module(version: str, staged: list[str]) -> str:
    published = "v0." + version.lstrip("v").split(".", 1)[1]
    lines = [
        "module hcs.test/kubepeers",
        "",
        "go 1.25",
        "",
        f"require k8s.io/kubernetes {version}",
        "",
    ]
    lines += [f"replace {module} => {module} {published}" for module in staged]
    return "\n".join(lines) + "\n"


def _version_ldflags(version: str) -> str:
    """The release in k8s.io/component-base/version, as upstream's build stamps it."""
    major, minor = version.lstrip("v").split(".")[:2]
    stamp = "k8s.io/component-base/version"
    return (
        f"-X {stamp}.gitVersion={version} -X {stamp}.gitMajor={major} "
        f"-X {stamp}.gitMinor={minor} -X {stamp}.gitTreeState=clean"
    )


def _build(log: Log, commands: tuple[str, ...], *, stamped: bool) -> Build:
    def build(go: str, work: Path, build_log: Path) -> str | None:
        staged = _staging_modules(go, KUBERNETES_VERSION)
        if isinstance(staged, str):
            return staged
        (work / "go.mod").write_text(_main_module(KUBERNETES_VERSION, staged))
        # Go 1.26+ builds the apiserver's OpenAPI wrong with encoding/json/v2 semantics.
        env = go_env(None, False) | {"GOEXPERIMENT": "nojsonv2", "GOFLAGS": "-mod=mod"}
        log(f"peers: building {', '.join(commands)} {KUBERNETES_VERSION} (log: {build_log})")
        ldflags = "-s -w" + (f" {_version_ldflags(KUBERNETES_VERSION)}" if stamped else "")
        for name in commands:
            reason = run_go(
                [
                    go,
                    "build",
                    "-trimpath",
                    f"-ldflags={ldflags}",
                    "-o",
                    name,
                    f"k8s.io/kubernetes/cmd/{name}",
                ],
                env,
                work,
                build_log,
            )
            if reason is not None:
                return reason
        for extra in ("go.mod", "go.sum"):
            (work / extra).unlink(missing_ok=True)
        return None

    return build


def ensure_kubernetes(log: Log = say) -> Path | str:
    """The directory holding kube-apiserver and kube-scheduler, or why they cannot be had."""
    return cached(
        "kubernetes", KUBERNETES_VERSION, COMMANDS, _build(log, COMMANDS, stamped=False), log
    )


def ensure_apiserver_stamped(log: Log = say) -> Path | str:
    """The directory holding a kube-apiserver that reports the release as its version, or why
    it cannot be had. Helm reads the version (a chart's `kubeVersion`, `.Capabilities`), and
    the control plane's own build says v0.0.0-master; with the Go cache warm from it, only
    the link is new (the stamp is a linker flag)."""
    build = _build(log, ("kube-apiserver",), stamped=True)
    return cached("kube-apiserver-stamped", KUBERNETES_VERSION, ("kube-apiserver",), build, log)


def ensure_kubernetes_node(log: Log = say) -> Path | str:
    """The directory holding kubelet, kube-controller-manager and kubectl (reporting the
    release as their version), or why they cannot be had."""
    build = _build(log, NODE_COMMANDS, stamped=True)
    return cached("kubernetes-node", KUBERNETES_VERSION, NODE_COMMANDS, build, log)


def ensure_controller_manager(log: Log = say) -> Path | str:
    """kube-controller-manager (for Jobs on the control plane of tests/cluster), or why it
    cannot be had: the node side's build, which the real-kubelet cluster needs anyway, so a
    run of both suites builds it once (a peer of its own would link it a second time)."""
    node = ensure_kubernetes_node(log)
    return node if isinstance(node, str) else node / "kube-controller-manager"


def find_etcd() -> Path | str:
    for candidate in ETCD_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return Path(candidate)
    return "etcd is not installed (apt install etcd-server)"
