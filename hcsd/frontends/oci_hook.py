"""`hcs-oci-hook`: an OCI hook for CRI-O and podman (hooks.d/hcs.json).

At createRuntime it records the container with hcsd (allocating from its assignment or
`hcs.io/*` annotations) and sends what the container's final config holds (devices, mounts,
env): hcsd refuses the container, and releases what it recorded, when any device it assigned or
any quota edit (libhcs, the /etc/ld.so.preload mount, the quota file and HCS_CONFIG) is missing
— a runtime that injects devices by CDI or a device plugin but has no hcsd NRI plugin would
otherwise run it with the whole device. A refused container fails to start with hcsd's text on
stderr: the container, what is missing or the figures, the reason and whether a retry may
succeed. At poststop it tells hcsd the container is gone. The state JSON arrives on stdin.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from hcsd.api.client import ApiError, Client
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.contract import paths
from hcsd.frontends.bundle import container_spec, is_sandbox, load_config, prepare_request
from hcsd.model import FrontEnd

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
            request = prepare_request(container_id, config, FrontEnd.OCI_HOOK.value)
            request.spec.CopyFrom(container_spec(config))
            client.prepare_container(request)
    except ApiError as e:
        # A refusal's text starts with the container already; other errors need naming it.
        print(f"hcs-oci-hook: {e if e.refusal else f'{container_id}: {e}'}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"hcs-oci-hook: {container_id}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
