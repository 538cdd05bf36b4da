"""Running a vendor's command-line tool (npu-smi, hy-smi, cnmon) safely.

Argument lists only, never a shell; a fixed environment (C locale, so numbers and headers are
the ones the parsers expect); a timeout, because a wedged driver makes these tools hang; and a
cap on the output read, because it is parsed in memory.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from hcsd.discovery.backend import DiscoveryError

__all__ = ["MAX_OUTPUT", "run_tool"]

MAX_OUTPUT = 4 * 2**20


def run_tool(argv: Sequence[str], *, timeout: float = 15.0) -> str:
    """Stdout of the tool; DiscoveryError naming the tool when it fails in any way."""
    name = os.path.basename(argv[0])
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C", "LANG": "C"}
    try:
        result = subprocess.run(
            list(argv),
            capture_output=True,
            timeout=timeout,
            env=env,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except FileNotFoundError as e:
        raise DiscoveryError(f"failed to run {name}: {argv[0]} not found") from e
    except subprocess.TimeoutExpired as e:
        raise DiscoveryError(f"failed to run {name}: no answer within {timeout:g}s") from e
    except OSError as e:
        raise DiscoveryError(f"failed to run {name}: {e.strerror}") from e
    if result.returncode != 0:
        detail = result.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        raise DiscoveryError(f"failed to run {name}: exit {result.returncode} {detail[0][:200]}")
    if len(result.stdout) > MAX_OUTPUT:
        raise DiscoveryError(f"failed to run {name}: more than {MAX_OUTPUT} bytes of output")
    return result.stdout.decode("utf-8", "replace")
