"""containerd, its runc shim and ctr, built from their Go modules once and cached under
~/.cache/hcs/peers (a warm run only checks the files). Returns a reason instead of binaries when
they cannot be had, so tests skip loudly."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CONTAINERD = "v2.3.4"
CACHE = Path(os.environ.get("HCS_CACHE", Path.home() / ".cache" / "hcs"))
BIN = CACHE / "peers" / "bin"
BUILDS = [
    (
        ["-tags", "no_btrfs urfave_cli_no_docs"],
        f"github.com/containerd/containerd/v2/cmd/containerd@{CONTAINERD}",
        "containerd",
        {},
    ),
    (
        [],
        f"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@{CONTAINERD}",
        "containerd-shim-runc-v2",
        {"CGO_ENABLED": "0"},
    ),
    (
        ["-tags", "no_btrfs urfave_cli_no_docs"],
        f"github.com/containerd/containerd/v2/cmd/ctr@{CONTAINERD}",
        "ctr",
        {},
    ),
]


@dataclass(frozen=True)
class Binaries:
    containerd: Path
    shim: Path
    ctr: Path
    runc: Path


def ensure_binaries() -> Binaries | str:
    runc = shutil.which("runc")
    if runc is None:
        return "runc is not installed (apt install runc)"
    go = shutil.which("go") or "/usr/local/go/bin/go"
    BIN.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "peers" / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time across test processes
        for flags, module, name, extra in BUILDS:
            if (BIN / name).exists():
                continue
            if not os.access(go, os.X_OK):
                return "Go is not installed: cannot build containerd for the runtime tests"
            print(f"building {module} (cached in {BIN})", flush=True)
            env = dict(
                os.environ,
                GOBIN=str(BIN),
                GOPATH=str(CACHE / "go"),
                GOCACHE=str(CACHE / "go" / "cache"),
                GOFLAGS="-mod=mod",
                **extra,
            )
            result = subprocess.run(
                [go, "install", *flags, module],
                env=env,
                capture_output=True,
                text=True,
                timeout=1800,
                check=False,
            )
            if result.returncode != 0:
                return f"building {name} failed: {result.stderr.strip()[-500:]}"
    return Binaries(BIN / "containerd", BIN / "containerd-shim-runc-v2", BIN / "ctr", Path(runc))
