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

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from tests.harness.peers.building import PEERS, Log, _go_env, _print, _run_go, build_lock, find_go

KUBERNETES_VERSION = os.environ.get("HCS_KUBERNETES_VERSION", "v1.36.3")
ETCD_CANDIDATES = ("/usr/bin/etcd", "/usr/local/bin/etcd")
COMMANDS = ("kube-apiserver", "kube-scheduler")


def _staging_modules(go: str, version: str) -> list[str] | str:
    """The `k8s.io/*` modules the release replaces with directories of its own tree."""
    found = subprocess.run(
        [go, "mod", "download", "-json", f"k8s.io/kubernetes@{version}"],
        env=_go_env(None, None),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if found.returncode != 0:
        return f"`go mod download k8s.io/kubernetes@{version}` failed: {found.stderr[-800:]}"
    gomod = Path(json.loads(found.stdout)["GoMod"]).read_text()
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


def ensure_kubernetes(log: Log = _print) -> Path | str:
    """The directory holding kube-apiserver and kube-scheduler, or why they cannot be had."""
    final = PEERS / f"kubernetes-{KUBERNETES_VERSION}"
    if all(os.access(final / name, os.X_OK) for name in COMMANDS) and (final / "BUILT").exists():
        return final
    with build_lock():
        if (final / "BUILT").exists():
            return final
        failed = PEERS / f"kubernetes-{KUBERNETES_VERSION}.failed"
        if failed.exists():
            return failed.read_text().strip()
        go = find_go()
        if go is None:
            return "Go is not installed: cannot build kube-apiserver/kube-scheduler"
        started = time.monotonic()
        staged = _staging_modules(go, KUBERNETES_VERSION)
        if isinstance(staged, str):
            return staged
        work = PEERS / f".kubernetes-{KUBERNETES_VERSION}.partial"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        (work / "go.mod").write_text(_main_module(KUBERNETES_VERSION, staged))
        # Go 1.26+ builds the apiserver's OpenAPI wrong with encoding/json/v2 semantics.
        env = _go_env(None, False) | {"GOEXPERIMENT": "nojsonv2", "GOFLAGS": "-mod=mod"}
        build_log = PEERS / f"kubernetes-{KUBERNETES_VERSION}.log"
        build_log.write_text("")
        log(
            f"peers: building kube-apiserver and kube-scheduler {KUBERNETES_VERSION} "
            f"(log: {build_log})"
        )
        packages = [f"k8s.io/kubernetes/cmd/{name}" for name in COMMANDS]
        reason: str | None = None
        for name, package in zip(COMMANDS, packages, strict=True):
            if reason is not None:
                break
            reason = _run_go(
                [go, "build", "-trimpath", "-ldflags=-s -w", "-o", name, package],
                env,
                work,
                build_log,
            )
        if reason is None:
            missing = [name for name in COMMANDS if not (work / name).exists()]
            reason = f"built nothing for {missing}" if missing else None
        if reason is not None:
            shutil.rmtree(work, ignore_errors=True)
            return f"building Kubernetes {KUBERNETES_VERSION} failed: {reason}"
        for extra in ("go.mod", "go.sum"):
            (work / extra).unlink(missing_ok=True)
        seconds = round(time.monotonic() - started, 1)
        (work / "BUILT").write_text(
            json.dumps({"version": KUBERNETES_VERSION, "seconds": seconds}) + "\n"
        )
        shutil.rmtree(final, ignore_errors=True)
        work.rename(final)
        log(f"peers: Kubernetes {KUBERNETES_VERSION} built in {seconds:.0f} s -> {final}")
        return final


def find_etcd() -> Path | str:
    for candidate in ETCD_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return Path(candidate)
    return "etcd is not installed (apt install etcd-server)"


if __name__ == "__main__":  # build ahead of a test run: python -m tests.harness.peers.kubernetes
    print(ensure_kubernetes())
