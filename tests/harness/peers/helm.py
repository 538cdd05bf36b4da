"""The `helm` CLI the chart is tested with, built from the `helm.sh/helm/v4` Go module at a
pinned release and cached under `~/.cache/hcs/peers/helm-<version>/` like the other peers.

Its go.mod has no `replace` or `exclude` directive, so `go install .../cmd/helm@version`
builds it; the ldflags stamp the release into `helm version` (upstream's Makefile does the
same), else it reports only the minor. Static (CGO off), as upstream ships it.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.harness.peers.building import Log, Target, cached, module_build, say

HELM_MODULE = "helm.sh/helm/v4"
# The newest v4 release on the module proxy when this was written (`go list -m -versions
# helm.sh/helm/v4`).
HELM_VERSION = os.environ.get("HCS_HELM_VERSION", "v4.3.1")


def ensure_helm(log: Log = say) -> Path | str:
    """The `helm` binary, built or found, or why it cannot be had."""
    stamp = f"{HELM_MODULE}/internal/version"
    ldflags = f"-s -w -X {stamp}.version={HELM_VERSION} -X {stamp}.gitTreeState=clean"
    targets = [Target("cmd/helm", cgo=False, ldflags=ldflags)]
    built = cached(
        "helm",
        HELM_VERSION,
        ["helm"],
        module_build(HELM_MODULE, HELM_VERSION, targets, log, as_main_module=False),
        log,
        record={"module": HELM_MODULE},
    )
    return built if isinstance(built, str) else built / "helm"
