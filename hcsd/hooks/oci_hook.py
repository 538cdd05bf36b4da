"""`hcs-oci-hook`: an OCI hook for CRI-O and podman (hooks.d/hcs.json).

At createRuntime it records the container with hcsd (allocating from its assignment or
`hcs.io/*` annotations) and checks that every device node hcsd assigned is in the container's
config — injected by hcsd's NRI plugin or by CDI. A container that holds an allocation without
its devices, or that hcsd refuses, fails to start with the reason on stderr (for a refusal,
hcsd's own text: the container, the figures, the reason and whether a retry may succeed). At
poststop it tells hcsd the container is gone. The state JSON arrives on stdin.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from hcsd.api.client import ApiError, Client
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.contract import paths
from hcsd.hooks.bundle import is_sandbox, load_config, prepare_request

__all__ = ["main"]

MAX_STATE = 1024 * 1024


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    socket = os.environ.get("HCS_SOCKET", paths.SOCKET)
    try:
        state = json.loads(sys.stdin.read(MAX_STATE))
        container_id, bundle = str(state["id"]), str(state["bundle"])
        status = str(state.get("status", ""))
    except (ValueError, KeyError, TypeError) as e:
        print(f"hcs-oci-hook: malformed container state on stdin: {e}", file=sys.stderr)
        return 1
    stage = args[0] if args else ("poststop" if status == "stopped" else "createRuntime")
    try:
        with Client(socket, timeout=5) as client:
            if stage == "poststop":
                client.container_gone(
                    pb.ContainerGoneRequest(container_id=container_id, deleted=True)
                )
                return 0
            config = load_config(bundle)
            if is_sandbox(config):
                return 0
            edits = client.prepare_container(prepare_request(container_id, config))
    except ApiError as e:
        # A refusal's text starts with the container already; other errors need naming it.
        print(f"hcs-oci-hook: {e if e.refusal else f'{container_id}: {e}'}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"hcs-oci-hook: {container_id}: {e}", file=sys.stderr)
        return 1
    return _check_injected(container_id, config, edits)


def _check_injected(
    container_id: str, config: dict[str, Any], edits: pb.PrepareContainerResponse
) -> int:
    if not edits.managed:
        return 0
    present = {d.get("path") for d in (config.get("linux") or {}).get("devices", [])}
    missing = sorted(d.path for d in edits.devices if d.path not in present)
    if missing:
        print(
            f"hcs-oci-hook: {container_id}: devices assigned by hcsd were not injected: "
            f"{', '.join(missing)} (enable NRI or CDI in the runtime)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
