"""`hcs-nri-plugin`: hcsd's NRI plugin in pre-launched form (`/opt/nri/plugins/10-hcsd`).

The runtime execs this with the NRI connection on fd 3 and an empty environment. The plugin
itself lives in hcsd (the ledger must have one owner), so this process only relays bytes
between fd 3 and hcsd's pre-launch socket until either side closes; hcsd then serves that
connection exactly like one it made itself. Standard library only: it starts in milliseconds.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys

from hcsd.contract import paths  # constants only: start-up stays in milliseconds

__all__ = ["main"]

DEFAULT_SOCKET = paths.NRI_PRELAUNCH_SOCKET
CHUNK = 65536


def relay(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways until one side reaches EOF or fails."""
    selector = selectors.DefaultSelector()
    selector.register(a, selectors.EVENT_READ, b)
    selector.register(b, selectors.EVENT_READ, a)
    try:
        while True:
            for key, _ in selector.select():
                source: socket.socket = key.fileobj  # type: ignore[assignment]
                data = source.recv(CHUNK)
                if not data:
                    return
                key.data.sendall(data)
    except OSError:
        return
    finally:
        selector.close()


def main() -> int:
    target = os.environ.get("HCS_NRI_PRELAUNCH_SOCKET", DEFAULT_SOCKET)
    fd = int(os.environ.get("NRI_PLUGIN_SOCKET", "3"))
    try:
        runtime = socket.socket(fileno=fd)
    except OSError as e:
        print(f"hcs-nri-plugin: no NRI connection on fd {fd}: {e}", file=sys.stderr)
        return 1
    daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        daemon.connect(target)
    except OSError as e:
        print(f"hcs-nri-plugin: cannot reach hcsd at {target}: {e}", file=sys.stderr)
        return 1
    relay(runtime, daemon)
    return 0


if __name__ == "__main__":
    sys.exit(main())
