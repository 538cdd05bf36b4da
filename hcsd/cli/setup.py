"""`hcsctl setup containerd|crio`: register hcsd with the container runtime's NRI.

Never edits anything without `--yes` or an interactive yes; `--dry-run` prints the diff. The
user's config is not rewritten: NRI is switched on through a drop-in (containerd `imports`,
CRI-O's crio.conf.d). The one edit of a user's file, adding the drop-in directory to
containerd's `imports`, is backed up first. Works without a running hcsd.

For containerd the drop-in also makes hcsd a required NRI plugin through NRI's built-in default
validator (`default_validator`, containerd 2.x: NRI v0.12.0 in containerd 2.3.7; absent from
containerd 1.7's NRI v0.8.0, which ignores the keys): while hcsd is not registered, the runtime
refuses to create containers instead of starting them without their devices and quota.
containerd merges an imported file into the config key by key, but a list in a plugin's section
replaces the config's (checked with containerd 2.3.7's `config dump`): the drop-in repeats the
config's own required plugins beside hcsd.

Once applied, the runtime is restarted through systemd's D-Bus API (RestartUnit) and waited for
until its unit is active again; a failure names the unit's state and result. Without systemd
(a container, another init) it says so and leaves the restart to the operator, as it did
before; `--no-restart` always does.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import shutil
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from hcsd.cli.runtime_restart import restart_runtime, started_before
from hcsd.contract import paths

__all__ = ["add_parser", "run"]

NRI_PLUGIN = "io.containerd.nri.v1.nri"
NRI_SECTION = f'[plugins."{NRI_PLUGIN}"]'
VALIDATOR_SECTION = f'[plugins."{NRI_PLUGIN}".default_validator]'
PLUGIN_NAME = "hcsd"  # what the plugin registers as (the validator also accepts "10-hcsd")
PLUGIN_BINARY = "/usr/bin/hcs-nri-plugin"


@dataclass(frozen=True)
class Change:
    path: Path
    old: str | None
    new: str
    mode: int = 0o644


class SetupError(Exception):
    pass


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    setup = commands.add_parser("setup", help="register hcsd with containerd or CRI-O (NRI)")
    runtimes = setup.add_subparsers(dest="runtime", required=True, metavar="RUNTIME")
    for name, text in (("containerd", "enable NRI in containerd"), ("crio", "enable NRI in CRI-O")):
        p = runtimes.add_parser(name, help=text)
        p.add_argument("--dry-run", action="store_true", help="print the diff, change nothing")
        p.add_argument("--yes", "-y", action="store_true", help="apply without asking")
        p.add_argument("--root", default="/", help="act on a tree under this root (tests)")
        p.add_argument(
            "--restart",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="restart the runtime through systemd once applied, and wait until it is "
            "active (default: yes, unless --root is given)",
        )
        p.add_argument("--unit", default=f"{name}.service", help="the runtime's systemd unit")
        p.add_argument(
            "--restart-timeout",
            type=float,
            default=None,
            metavar="SECONDS",
            help="how long to wait for the unit to be active again (default: the unit's "
            "TimeoutStopSec= plus TimeoutStartSec= plus 15 s; until the restart job ends "
            "where either is infinite)",
        )
    containerd = runtimes.choices["containerd"]
    containerd.add_argument("--config", default="/etc/containerd/config.toml")
    containerd.add_argument("--drop-in-dir", default="/etc/containerd/conf.d")
    containerd.add_argument(
        "--prelaunched",
        action="store_true",
        help="also install /opt/nri/plugins/INDEX-hcsd (containerd starts the plugin)",
    )
    containerd.add_argument("--index", default="10", help="NRI plugin index (two digits)")
    crio = runtimes.choices["crio"]
    crio.add_argument("--drop-in-dir", default="/etc/crio/crio.conf.d")


def _under(root: str, path: str) -> Path:
    return Path(root) / path.lstrip("/")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def containerd_changes(args: argparse.Namespace) -> tuple[list[Change], list[str]]:
    notes: list[str] = []
    config_path = _under(args.root, args.config)
    text = _read(config_path)
    try:
        config = tomllib.loads(text or "")
    except tomllib.TOMLDecodeError as e:
        raise SetupError(f"{args.config} is not valid TOML: {e}") from None
    # version 2 is containerd 1.x's format, version 3 containerd 2.x's (NRI on by default).
    version = config.get("version", 3 if text is None else 1)
    if version not in (2, 3):
        raise SetupError(f"{args.config}: config version {version!r} is not supported (2 or 3)")
    nri = config.get("plugins", {}).get(NRI_PLUGIN, {})
    changes: list[Change] = []
    enabled = nri.get("disable") is False or (version == 3 and "disable" not in nri)
    validator = nri.get("default_validator", {})
    already = [str(p) for p in validator.get("required_plugins", [])]
    required = validator.get("enable") is True and PLUGIN_NAME in already
    if enabled:
        notes.append(f"NRI is already enabled (config version {version})")
    if required:
        notes.append(f"{args.config} already requires the {PLUGIN_NAME} NRI plugin")
    if version == 2:
        notes.append(
            "containerd 1.7 (NRI v0.8) has no NRI validator and ignores default_validator: "
            "there, containers created while hcsd is down start without their devices and "
            "quota (hcsd reports them at its next Synchronize); containerd 2.x honours it"
        )
    if not (enabled and required):
        drop_in_dir = args.drop_in_dir.rstrip("/")
        drop_in = f"{drop_in_dir}/{args.index}-hcsd-nri.toml"
        body = "# Written by hcsctl setup containerd: NRI on, with hcsd required.\n"
        body += f"version = {version}\n"
        if not enabled:
            body += (
                f"\n{NRI_SECTION}\n  disable = false\n"
                f'  plugin_path = "{paths.NRI_PLUGIN_DIR}"\n  socket_path = "{paths.NRI_SOCKET}"\n'
            )
        body += (
            f"\n{VALIDATOR_SECTION}\n"
            "  # Refuse to create a container while hcsd's plugin is not registered (hcsd down or\n"
            "  # restarting, the first moments after a containerd restart) rather than start it\n"
            "  # without its devices and quota. Every container is refused then, not only GPU\n"
            "  # ones; see hcsd's docs/runtime.md for the per-pod alternative.\n"
            "  enable = true\n"
            f"  required_plugins = {_toml_strings([*already, PLUGIN_NAME])}\n"
        )
        changes.append(Change(_under(args.root, drop_in), _read(_under(args.root, drop_in)), body))
        imports = config.get("imports", [])
        pattern = f"{drop_in_dir}/*.toml"
        if pattern not in imports and drop_in not in imports:
            changes.append(Change(config_path, text, _add_import(text or "", pattern, imports)))
        if nri.get("disable") is True:
            notes.append(f"{args.config} disables NRI; the drop-in (imported later) overrides it")
    if args.prelaunched:
        wrapper = f"{paths.NRI_PLUGIN_DIR}/{args.index}-hcsd"
        body = f"#!/bin/sh\n# Installed by hcsctl setup containerd.\nexec {PLUGIN_BINARY}\n"
        path = _under(args.root, wrapper)
        changes.append(Change(path, _read(path), body, 0o755))
    return changes, notes


def _toml_strings(values: list[str]) -> str:
    """A TOML array of basic strings (JSON's string escapes are TOML's)."""
    return "[" + ", ".join(json.dumps(v) for v in dict.fromkeys(values)) + "]"


def _add_import(text: str, pattern: str, imports: list[str]) -> str:
    """Add pattern to the top-level imports list with a one-line edit."""
    lines = text.splitlines(keepends=True)
    new_line = "imports = " + "[" + ", ".join(f'"{i}"' for i in [*imports, pattern]) + "]\n"
    for i, line in enumerate(lines):
        if line.lstrip().startswith("["):
            break
        if line.split("=")[0].strip() == "imports":
            if not line.rstrip().endswith("]"):
                raise SetupError("a multi-line imports list: add " + pattern + " to it by hand")
            lines[i] = new_line
            return "".join(lines)
    for i, line in enumerate(lines):
        if line.split("=")[0].strip() == "version":
            lines.insert(i + 1, new_line)
            return "".join(lines)
    return new_line + "".join(lines)


def crio_changes(args: argparse.Namespace) -> tuple[list[Change], list[str]]:
    notes = []
    hook = _under(args.root, paths.OCI_HOOK_FILE)
    if hook.exists():
        notes.append("OCI hook in /usr/share/containers/oci/hooks.d (CRI-O's default hooks_dir)")
    else:
        notes.append("no hooks.d/hcs.json: the hcsd package installs it")
    path = _under(args.root, f"{args.drop_in_dir.rstrip('/')}/10-hcsd-nri.conf")
    body = (
        "# Written by hcsctl setup crio: switch on NRI for hcsd.\n"
        f'[crio.nri]\nenable_nri = true\nnri_listen = "{paths.NRI_SOCKET}"\n'
    )
    return [Change(path, _read(path), body)], notes


def diff(change: Change) -> str:
    old = (change.old or "").splitlines(keepends=True)
    label = str(change.path)
    return "".join(
        difflib.unified_diff(
            old,
            change.new.splitlines(keepends=True),
            "/dev/null" if change.old is None else label,
            label,
        )
    )


def apply(change: Change) -> Path | None:
    """Write the change (atomically); the backup of the file it replaced, if any."""
    path = change.path
    path.parent.mkdir(parents=True, exist_ok=True)
    backup = None
    if change.old is not None:
        backup = path.with_name(f"{path.name}.hcs-backup-{time.strftime('%Y%m%d%H%M%S')}")
        shutil.copy2(path, backup)
        print(f"backup: {backup}")
    tmp = path.with_name(f".{path.name}.hcs-tmp")
    tmp.write_text(change.new, encoding="utf-8")
    os.chmod(tmp, change.mode)
    os.replace(tmp, path)
    print(f"wrote {path}")
    return backup


def undo(written: list[tuple[Path, Path | None]], unit: str) -> str:
    """The commands that put back the files as they were before this run."""
    steps = [f"cp -p {backup} {path}" if backup else f"rm {path}" for path, backup in written]
    return f"to go back to the configuration before: {'; '.join(steps)}; systemctl restart {unit}"


def unchanged(args: argparse.Namespace, files: list[Path], *, restart: bool) -> int:
    """Nothing to write. An explicit --restart restarts; by default the runtime is restarted
    (with --yes) or the operator told, when it started before the files were written: a
    restart after an earlier run failed or was skipped, which re-running setup finishes."""
    if args.dry_run or not restart:
        return 0
    if args.restart is not True:
        stale = started_before(args.unit, files)
        if stale is None:
            return 0
        print(f"{args.unit} started before {stale} was written: it runs without it")
        if not args.yes:
            print(f"restart it: systemctl restart {args.unit} (or hcsctl setup ... --yes)")
            return 0
    return restart_runtime(args.runtime, args.unit, args.restart_timeout, restart=True)


def run(args: argparse.Namespace) -> int:
    try:
        files, notes = (
            containerd_changes(args) if args.runtime == "containerd" else crio_changes(args)
        )
    except SetupError as e:
        print(f"hcsctl: {e}", file=sys.stderr)
        return 1
    for note in notes:
        print(note)
    restart = args.restart if args.restart is not None else args.root == "/"
    changes = [c for c in files if c.old != c.new]
    if not changes:
        print("nothing to change")
        return unchanged(args, [c.path for c in files], restart=restart)
    for change in changes:
        sys.stdout.write(diff(change))
    if args.dry_run:
        if restart:
            print(f"would restart {args.unit} through systemd")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            print("hcsctl: not applied: pass --yes (or run interactively)", file=sys.stderr)
            return 2
        question = f" and restart {args.unit}" if restart else ""
        if input(f"apply these changes{question}? [y/N] ").strip().lower() not in ("y", "yes"):
            print("not applied")
            return 1
    written = [(change.path, apply(change)) for change in changes]
    status = restart_runtime(args.runtime, args.unit, args.restart_timeout, restart=restart)
    if status == 1:  # the runtime did not come back with the new files
        print(f"hcsctl: {undo(written, args.unit)}", file=sys.stderr)
    return status
