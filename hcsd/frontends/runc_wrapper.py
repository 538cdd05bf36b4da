"""`hcs-runtime`: a runc wrapper for runtimes without NRI (containerd 1.6, Debian 12's default).

Configure it as the runc binary (`BinaryName = "/usr/bin/hcs-runtime"`). On `create` and `run`
it asks hcsd for the container's edits, writes them into the bundle's config.json, then execs the
real runc with the unchanged arguments; on `delete` it tells hcsd the container is gone. A
refusal (forged assignment, no room, a full disk) fails creation with hcsd's text on stderr:
the container, the figures, the reason, and whether a retry may succeed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from hcsd.api.client import ApiError, Client
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.contract import paths
from hcsd.frontends.bundle import apply_edits, is_sandbox, load_config, prepare_request, save_config
from hcsd.model import FrontEnd

__all__ = ["main", "parse_runc_args"]

DEFAULT_SOCKET = paths.SOCKET
RUNC_CANDIDATES = ("/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc")
_GLOBAL_WITH_VALUE = {"--root", "--log", "--log-format", "--criu", "--rootless"}
_COMMAND_WITH_VALUE = {
    "--bundle",
    "-b",
    "--console-socket",
    "--pid-file",
    "--preserve-fds",
    "--pidfd-socket",
}


def parse_runc_args(args: Sequence[str]) -> tuple[str, str, str]:
    """(subcommand, bundle, container id) from a runc command line; "" where absent."""
    position = 0
    while position < len(args):
        token = args[position]
        if token in _GLOBAL_WITH_VALUE:
            position += 2
        elif token.startswith("-"):
            position += 1
        else:
            break
    if position >= len(args):
        return "", "", ""
    command = args[position]
    bundle, positional = os.getcwd(), []
    rest = args[position + 1 :]
    index = 0
    while index < len(rest):
        token = rest[index]
        name, equals, value = token.partition("=")
        if name in _COMMAND_WITH_VALUE:
            if not equals:
                index += 1
                value = rest[index] if index < len(rest) else ""
            if name in ("--bundle", "-b"):
                bundle = value
        elif not token.startswith("-"):
            positional.append(token)
        index += 1
    return command, bundle, positional[-1] if positional else ""


def _runc() -> str:
    configured = os.environ.get("HCS_RUNC")
    if configured:
        return configured
    for candidate in RUNC_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError("runc not found (set HCS_RUNC)")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command, bundle, container_id = parse_runc_args(args)
    socket = os.environ.get("HCS_SOCKET", DEFAULT_SOCKET)
    try:
        if command in ("create", "run") and container_id:
            config = load_config(bundle)
            if not is_sandbox(config):
                with Client(socket, timeout=5) as client:
                    edits = client.prepare_container(
                        prepare_request(container_id, config, FrontEnd.RUNC_WRAPPER.value)
                    )
                if edits.managed:
                    save_config(bundle, apply_edits(config, edits))
        elif command == "delete" and container_id:
            try:
                with Client(socket, timeout=5) as client:
                    client.container_gone(
                        pb.ContainerGoneRequest(container_id=container_id, deleted=True)
                    )
            except ApiError as e:  # deleting must not fail because hcsd is down
                print(f"hcs-runtime: warning: {e}", file=sys.stderr)
        runc = _runc()
    except (ApiError, OSError, ValueError) as e:
        print(f"hcs-runtime: {e}", file=sys.stderr)
        return 1
    os.execv(runc, [runc, *args])  # noqa: S606 - the runtime's own argv, no shell
    return 0  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main())
