"""`kubectl hcs`: kubectl runs any executable named `kubectl-hcs` on PATH as `kubectl hcs`.

It offers hcsctl's cluster commands (those that read the API server, not a node's hcsd):
`kubectl hcs cluster [--json] [--kubeconfig F] [--context C]`; `kubectl hcs` alone is
`kubectl hcs cluster`. kubectl passes no flags of its own to a plugin, so --kubeconfig and
--context go after the command; $KUBECONFIG is inherited.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hcsd.cli import cluster

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl hcs",
        description="HCS's cluster view as a kubectl plugin (the same as `hcsctl cluster`).",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    cluster.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if not words or (words[0].startswith("-") and words[0] not in ("-h", "--help")):
        words.insert(0, "cluster")
    args = build_parser().parse_args(words)
    return cluster.run(args)


if __name__ == "__main__":
    sys.exit(main())
