"""Several kubeconfig files merged into one, the way kubectl (client-go) merges them.

The `kubernetes` package merges a `:`-separated list differently from kubectl: the last
file's current-context wins, and relative paths are resolved against the wrong file. So the
files are merged here and the package gets the one result (`load_kube_config_from_dict`):

- files that are missing or empty are skipped;
- of each named cluster, user and context, the first file that defines it wins;
- the first non-empty current-context wins;
- each file's relative paths (certificate-authority, client-certificate, client-key,
  tokenFile, an exec command with a `/`) are made absolute against that file's directory.

Every way a file can be unreadable becomes a KubeconfigError with the file's name.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = ["KubeconfigError", "merge_files"]

# (section, entry key, fields holding a path) as client-go's ResolveLocalPaths.
_PATHS = (
    ("clusters", "cluster", ("certificate-authority",)),
    ("users", "user", ("client-certificate", "client-key", "tokenFile")),
)


class KubeconfigError(Exception):
    """A kubeconfig file cannot be read or is not a kubeconfig."""


def _read(path: Path) -> dict[str, Any] | None:
    """The file's mapping; None when it is missing or empty (kubectl skips those)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise KubeconfigError(f"cannot read kubeconfig {path}: {e}") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        problem = str(e).replace("\n", " ")
        raise KubeconfigError(f"kubeconfig {path} is not valid YAML: {problem}") from e
    if data is None:
        return None
    if not isinstance(data, dict):
        raise KubeconfigError(f"kubeconfig {path} is not a mapping (a {type(data).__name__})")
    return data


def _absolute(entry: dict[str, Any], keys: Sequence[str], base: Path) -> None:
    for key in keys:
        value = entry.get(key)
        if isinstance(value, str) and value and not os.path.isabs(value):
            entry[key] = str(base / value)


def _resolve(data: dict[str, Any], base: Path, path: Path) -> None:
    """Make the file's relative paths absolute against its own directory, in place."""
    for section, inner, keys in _PATHS:
        for item in _entries(data, section, path):
            entry = item.get(inner)
            if isinstance(entry, dict):
                _absolute(entry, keys, base)
                command = (entry.get("exec") or {}) if inner == "user" else {}
                if isinstance(command, dict) and "/" in str(command.get("command", "")):
                    _absolute(command, ("command",), base)


def _entries(data: dict[str, Any], section: str, path: Path) -> list[dict[str, Any]]:
    items = data.get(section) or []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise KubeconfigError(f"kubeconfig {path}: {section} is not a list of entries")
    return items


def merge_files(paths: Sequence[str]) -> dict[str, Any] | None:
    """The merged kubeconfig of `paths` (in order of precedence); None when every file is
    missing or empty."""
    merged: dict[str, Any] = {"clusters": [], "users": [], "contexts": [], "current-context": ""}
    seen: dict[str, set[str]] = {"clusters": set(), "users": set(), "contexts": set()}
    found = False
    for name in paths:
        path = Path(name)
        data = _read(path)
        if data is None:
            continue
        found = True
        _resolve(data, path.resolve().parent, path)
        for section, names in seen.items():
            for item in _entries(data, section, path):
                key = str(item.get("name", ""))
                if key not in names:
                    names.add(key)
                    merged[section].append(item)
        if not merged["current-context"] and data.get("current-context"):
            merged["current-context"] = str(data["current-context"])
    return merged if found else None
