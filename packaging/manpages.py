"""Render the man pages of hcsd, hcsctl and the cluster tools from their own --help, and hcsd's
CONFIGURATION section from its config sections (no drift)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PAGES = {
    ("hcsd", "8"): [["hcsd.daemon.lifecycle"]],
    ("hcsctl", "1"): [
        ["hcsd.cli.hcsctl"],
        ["hcsd.cli.hcsctl", "setup"],
        ["hcsd.cli.hcsctl", "cluster"],
    ],
    ("kubectl-hcs", "1"): [["hcsd.cli.kubectl_hcs"], ["hcsd.cli.kubectl_hcs", "cluster"]],
    ("hcs-syncer", "8"): [["hcsd.cluster.syncer_cli"]],
    ("hcs-scheduler-extender", "8"): [["hcsd.cluster.extender_cli"]],
    ("hcs-admission-webhook", "8"): [["hcsd.cluster.webhook_server"]],
    ("hcs-controller", "8"): [["hcsd.cluster.healer_cli"]],
}
# Sections rendered as roff by a module of their own, after the usage.
EXTRA = {("hcsd", "8"): [["hcsd.daemon.reference", "man"]]}


def roff(text: str) -> str:
    return "\n".join(line.replace("\\", "\\e").replace("-", "\\-") for line in text.splitlines())


def main() -> int:
    version, out = sys.argv[1], Path(sys.argv[2])
    for (name, section), commands in PAGES.items():
        parts = [f'.TH {name.upper()} {section} "" "hcsd {version}" "HCS"', ".SH NAME"]
        parts.append(f"{name} \\- see the usage below")
        for command in commands:
            result = subprocess.run(
                [sys.executable, "-m", *command[:1], *command[1:], "--help"],
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                continue
            title = " ".join([name, *command[1:]])
            parts += [f".SH {title.upper()}", ".nf", roff(result.stdout), ".fi"]
        for command in EXTRA.get((name, section), []):
            result = subprocess.run(
                [sys.executable, "-m", *command], capture_output=True, text=True, check=True
            )
            parts.append(result.stdout.rstrip("\n"))
        parts += [".SH SEE ALSO", "/usr/share/doc/hcsd/README.md, packaging.md, configuration.md"]
        (out / f"man{section}" / f"{name}.{section}").write_text("\n".join(parts) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
