"""The measuring process's environment: what the vendor's toolkit needs, and nothing of hcsd's.

The worker would otherwise inherit hcsd's whole environment: NOTIFY_SOCKET and WATCHDOG_* (a
child that talks to systemd as if it were hcsd), PYTHONPATH (other code on its import path),
whatever the unit sets for hcsd alone. It gets a minimal base (PATH, LANG) and the entries of
`measure.worker_env`: a NAME passes that variable from hcsd's environment if set, `PREFIX*`
passes every variable starting with PREFIX, and NAME=value sets one. The defaults pass what the
toolkits' set-up scripts export for their libraries (CANN's set_env.sh: LD_LIBRARY_PATH,
ASCEND_*; DTK/ROCm: ROCM_PATH, HIP_PATH, DTK_HOME). The vendor's visibility variable is set
last, by `running`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

__all__ = ["DEFAULT_WORKER_ENV", "check_entry", "worker_environment"]

DEFAULT_WORKER_ENV = (
    "PATH",
    "LD_LIBRARY_PATH",
    "ASCEND_*",
    "TOOLCHAIN_HOME",
    "ROCM_PATH",
    "HIP_PATH",
    "DTK_HOME",
)
_BASE = {"PATH": os.defpath, "LANG": "C.UTF-8"}
_ENTRY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\*|=.*)?", re.DOTALL)


def check_entry(entry: str) -> str:
    """`entry` if it is NAME, PREFIX* or NAME=value; ValueError otherwise."""
    if not isinstance(entry, str) or not _ENTRY.fullmatch(entry):
        raise ValueError(f"expected NAME, PREFIX* or NAME=value, got {entry!r}")
    return entry


def worker_environment(
    entries: Sequence[str], inherited: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment for the worker from `entries` and hcsd's own (`inherited`)."""
    source = os.environ if inherited is None else inherited
    env = dict(_BASE)
    for entry in entries:
        name, equals, value = entry.partition("=")
        if equals:
            env[name] = value
        elif name.endswith("*"):
            env.update({k: v for k, v in source.items() if k.startswith(name[:-1])})
        elif name in source:
            env[name] = source[name]
    return env
