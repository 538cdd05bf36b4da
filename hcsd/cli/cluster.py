"""`hcsctl cluster` (and `kubectl hcs cluster`): the cluster's accelerators as people ask
about them, read from the API server with kubectl's credentials.

Only this command talks to Kubernetes: the client and everything under hcsd.cluster are
imported when it runs, so the node commands (`hcsctl status`) start as fast as before.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]

HELP = "the cluster's devices, VRAM, ACU, sick devices, pending pods and quotas"


def add_parser(commands: Any) -> None:
    """The `cluster` subcommand; --json and --timeout also after it (for `kubectl hcs`)."""
    parser = commands.add_parser(
        "cluster",
        help=HELP,
        description=(
            "Per vendor and model: devices, VRAM, ACU (abstract compute units, 1% of an "
            "A100's FP16 TFLOPS; 'measured' where nodes measured their devices, 'profile' "
            "otherwise); devices not healthy with their reason; Pending pods that ask for "
            "ai.compute/* with the scheduler's reason; ComputeQuota usage per namespace. "
            "Credentials as kubectl finds them: --kubeconfig, $KUBECONFIG, ~/.kube/config, "
            "else the pod's service account. Needs the hcs-viewer ClusterRole's rights; "
            "the pending pods also hcs-viewer-pods' (without them they are not shown)."
        ),
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: as kubectl)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        help="show the Pending pods of this namespace only (needs list pods there)",
    )
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="the Pending pods of every namespace (the default, when RBAC allows it)",
    )
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    parser.add_argument(
        "--timeout", type=float, default=argparse.SUPPRESS, help="seconds per API request"
    )


def run(args: argparse.Namespace) -> int:
    from hcsd.cli.cluster_tables import view_json, view_text
    from hcsd.cluster.cluster_reader import ViewError, connect, find_kubeconfig, read_view
    from hcsd.profiles.database import default_database

    try:
        path = find_kubeconfig(args.kubeconfig, os.environ, Path.home())
        kube, source = connect(path, args.context, timeout=getattr(args, "timeout", 10.0))
        try:
            view = read_view(kube, source, namespace=getattr(args, "namespace", None))
        finally:
            kube.close()
    except ViewError as e:
        print(f"hcsctl: {e}", file=sys.stderr)
        return 1
    acu_tflops = default_database().acu_tflops
    try:
        if getattr(args, "json", False):
            json.dump(view_json(view, source, acu_tflops), sys.stdout, indent=2, sort_keys=True)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(view_text(view, source, acu_tflops, time.time()))
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    return 0
