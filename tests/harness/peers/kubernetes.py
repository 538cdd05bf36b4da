"""The real Kubernetes control plane of the cluster tests: kube-apiserver and kube-scheduler
built from the `k8s.io/kubernetes` Go module at a pinned release, and Debian's etcd.

`k8s.io/kubernetes` cannot be `go install`ed: its go.mod replaces every `k8s.io/<staging>`
module with a directory of its own tree. So a small main module of ours requires it and
replaces each staging module with its published `v0.<minor>.<patch>` tag; the list of staging
modules is read from the release's own go.mod at build time, so a version bump needs no edit
here. The binaries are cached under `~/.cache/hcs/peers/kubernetes-<version>/` (a cold build
is ~10 minutes on 2 cores; the Go cache grows by ~5 GB).
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


def _build(log: Log) -> Build:
    def build(go: str, work: Path, build_log: Path) -> str | None:
        staged = _staging_modules(go, KUBERNETES_VERSION)
        if isinstance(staged, str):
            return staged
        (work / "go.mod").write_text(_main_module(KUBERNETES_VERSION, staged))
        # Go 1.26+ builds the apiserver's OpenAPI wrong with encoding/json/v2 semantics.
        env = go_env(None, False) | {"GOEXPERIMENT": "nojsonv2", "GOFLAGS": "-mod=mod"}
        log(
            f"peers: building kube-apiserver and kube-scheduler {KUBERNETES_VERSION} "
            f"(log: {build_log})"
        )
        for name in COMMANDS:
            reason = run_go(
                [
                    go,
                    "build",
                    "-trimpath",
                    "-ldflags=-s -w",
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
    return cached("kubernetes", KUBERNETES_VERSION, COMMANDS, _build(log), log)


def find_etcd() -> Path | str:
    for candidate in ETCD_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return Path(candidate)
    return "etcd is not installed (apt install etcd-server)"
