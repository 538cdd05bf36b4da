"""The container runtime peers: containerd 2.3 (and 1.7, optional) with its runc shim and ctr,
crictl, and Debian's runc.

No container runtime with NRI ships in Debian 12 (its containerd 1.6 predates NRI), and no
registry is reachable, so containerd, its shim, ctr and crictl are built from the Go module
proxy once and cached under `~/.cache/hcs/peers/<name>-<version>/` (building.py); a warm run
only looks at the files. runc is Debian's (`apt install runc`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from tests.harness.peers.building import Log, Target, cached, module_build, say

# The newest 2.3 patch on the module proxy when this was written (`go list -m -versions
# github.com/containerd/containerd/v2`); it vendors NRI v0.12.
CONTAINERD_VERSION = os.environ.get("HCS_CONTAINERD_VERSION", "v2.3.7")
# The newest 1.7 patch: NRI v0.8, off by default. Optional: hcsd must keep working with it.
CONTAINERD_17_VERSION = os.environ.get("HCS_CONTAINERD_17_VERSION", "v1.7.35")
# A 2.1 patch: NRI v0.8 on by default (the 2.x lines before NRI's args adjustment). Optional.
CONTAINERD_21_VERSION = os.environ.get("HCS_CONTAINERD_21_VERSION", "v2.1.9")
# The proxy refuses to list cri-tools' versions (403) but serves a named one.
CRICTL_VERSION = os.environ.get("HCS_CRICTL_VERSION", "v1.36.0")
RUNC = Path("/usr/sbin/runc")
CONTAINERD_TAGS = "no_btrfs urfave_cli_no_docs"


@dataclass(frozen=True)
class Binaries:
    """Paths of the peers a `Containerd` needs; `containerd_version` names the build."""

    containerd: Path
    shim: Path
    ctr: Path
    runc: Path
    crictl: Path
    containerd_version: str
    crictl_version: str

    @property
    def containerd_major(self) -> int:
        """1 or 2: the config format and plugin names differ between the two lines."""
        return int(self.containerd_version.lstrip("v").split(".")[0])

    @property
    def shim_dir_configurable(self) -> bool:
        """containerd 2.3 takes the shim sockets' directory from its config; older ones
        hard-code /run/containerd/s (they get a private /run)."""
        major, minor = self.containerd_version.lstrip("v").split(".")[:2]
        return (int(major), int(minor)) >= (2, 3)


def _containerd(module: str, version: str, log: Log, *, as_main_module: bool) -> Path | str:
    """containerd, its runc shim (static, as upstream ships it) and ctr (to import images)."""
    ldflags = f"-X {module}/version.Version={version}"
    targets = [
        Target("cmd/containerd", tags=CONTAINERD_TAGS, ldflags=ldflags),
        Target("cmd/containerd-shim-runc-v2", cgo=False, ldflags=ldflags),
        Target("cmd/ctr", tags=CONTAINERD_TAGS, ldflags=ldflags),
    ]
    return cached(
        "containerd",
        version,
        [Path(t.package).name for t in targets],
        module_build(module, version, targets, log, as_main_module=as_main_module),
        log,
        # Only the optional 1.7 is built as the main module; remember why it could not be.
        remember_failure=as_main_module,
        record={"module": module},
    )


def _crictl(log: Log) -> Path | str:
    """crictl, built as the main module: `go install crictl@version` looks up the module's
    deprecation in its version list, which the proxy refuses for cri-tools (403)."""
    module = "sigs.k8s.io/cri-tools"
    ldflags = f"-X {module}/pkg/version.Version={CRICTL_VERSION.lstrip('v')}"
    targets = [Target("cmd/crictl", cgo=False, ldflags=ldflags)]
    built = cached(
        "crictl",
        CRICTL_VERSION,
        ["crictl"],
        module_build(module, CRICTL_VERSION, targets, log, as_main_module=True),
        log,
        record={"module": module},
    )
    return built if isinstance(built, str) else built / "crictl"


def ensure_binaries(log: Log = say) -> Binaries | str:
    """containerd 2.3, crictl and runc, built or found; the reason as a string when not."""
    if not os.access(RUNC, os.X_OK):
        return f"runc is not installed at {RUNC} (apt install runc)"
    built = _containerd(
        "github.com/containerd/containerd/v2", CONTAINERD_VERSION, log, as_main_module=False
    )
    if isinstance(built, str):
        return built
    crictl = _crictl(log)
    if isinstance(crictl, str):
        return crictl
    return Binaries(
        containerd=built / "containerd",
        shim=built / "containerd-shim-runc-v2",
        ctr=built / "ctr",
        runc=RUNC,
        crictl=crictl,
        containerd_version=CONTAINERD_VERSION,
        crictl_version=CRICTL_VERSION,
    )


def ensure_containerd_17(binaries: Binaries, log: Log = say) -> Binaries | str:
    """`binaries` with containerd 1.7 swapped in (NRI v0.8), or why it cannot be had.

    Go refuses `go install` for 1.7 (its go.mod has an `exclude` directive), so it is built as
    the main module from a copy of its source; a failure is remembered (see `cached`).
    """
    return _swapped(binaries, "github.com/containerd/containerd", CONTAINERD_17_VERSION, log)


def ensure_containerd_21(binaries: Binaries, log: Log = say) -> Binaries | str:
    """`binaries` with containerd 2.1 swapped in (NRI v0.8, no args adjustment), or why it
    cannot be had; built as the main module like 1.7 (its go.mod has `exclude` directives)."""
    return _swapped(binaries, "github.com/containerd/containerd/v2", CONTAINERD_21_VERSION, log)


def _swapped(binaries: Binaries, module: str, version: str, log: Log) -> Binaries | str:
    built = _containerd(module, version, log, as_main_module=True)
    if isinstance(built, str):
        return built
    return dataclasses.replace(
        binaries,
        containerd=built / "containerd",
        shim=built / "containerd-shim-runc-v2",
        ctr=built / "ctr",
        containerd_version=version,
    )
