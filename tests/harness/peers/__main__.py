"""`python -m tests.harness.peers [runtimes] [kubernetes] [helm]`: build the peers ahead of a test
run (all of them when none is named; `kubernetes` is the control plane and the node side);
prints where each is, or why it cannot be had."""

from __future__ import annotations

import sys

from tests.harness.peers.helm import ensure_helm
from tests.harness.peers.kubernetes import ensure_kubernetes, ensure_kubernetes_node
from tests.harness.peers.runtimes import ensure_binaries, ensure_containerd_17


def main(names: list[str]) -> int:
    wanted = set(names) or {"runtimes", "kubernetes", "helm"}
    unknown = wanted - {"runtimes", "kubernetes", "helm"}
    if unknown:
        print(f"unknown peers: {', '.join(sorted(unknown))} (runtimes, kubernetes, helm)")
        return 2
    if "runtimes" in wanted:
        found = ensure_binaries()
        print(found)
        if not isinstance(found, str):
            print(ensure_containerd_17(found))
    if "kubernetes" in wanted:
        print(ensure_kubernetes())
        print(ensure_kubernetes_node())
    if "helm" in wanted:
        print(ensure_helm())
    return 0


raise SystemExit(main(sys.argv[1:]))
