"""OCI bundles for runc, and hcs-runtime (the runc wrapper) run on them against a Daemon.

A bundle is Debian's static busybox with a few applets, the directories hcsd mounts into, an
empty /etc/ld.so.preload (hcsd's file replaces it) and `runc spec`'s config with the given
annotations and shell script. Needs root, runc and busybox-static.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.harness.daemon import Daemon

BIN = Path(sys.executable).parent
APPLETS = ("sh", "cat", "stat", "env", "ls", "echo", "id", "test")


def make_bundle(root: Path, annotations: dict[str, str], script: str) -> Path:
    bundle = root / "bundle"
    rootfs = bundle / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy("/bin/busybox", rootfs / "bin" / "busybox")
    for applet in APPLETS:
        (rootfs / "bin" / applet).symlink_to("busybox")
    for directory in ("dev", "proc", "sys", "etc", "run", "usr/lib/hcs", "tmp"):
        (rootfs / directory).mkdir(parents=True, exist_ok=True)
    (rootfs / "etc" / "ld.so.preload").write_text("")
    subprocess.run(["runc", "spec"], cwd=bundle, check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["terminal"] = False
    config["process"]["args"] = ["sh", "-c", script]
    config["root"]["readonly"] = False
    config["annotations"] = annotations
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


def hcs_runtime(
    daemon: Daemon, root: Path, *args: str, **run: Any
) -> subprocess.CompletedProcess[Any]:
    """hcs-runtime as containerd runs it (`--root`, then runc's arguments), talking to
    `daemon` and execing Debian's runc; `run` goes to subprocess.run (stdio, text)."""
    env = dict(os.environ, HCS_SOCKET=daemon.socket, HCS_RUNC=shutil.which("runc") or "runc")
    return subprocess.run(
        [str(BIN / "hcs-runtime"), "--root", str(root / "runc-state"), *args],
        env=env,
        timeout=60,
        check=False,
        **run,
    )
