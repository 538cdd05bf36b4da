"""The node the runtime tests run hcsd on, connected to a real containerd's NRI socket.

One A100 whose device nodes borrow /dev/null's numbers (1:3), so runc creates real nodes in
the container; the real libhcs; the assignment key the tests sign with. Shared by the runtime
suites and the runtime benchmark.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness.daemon import Daemon, Settings, build_libhcs
from tests.harness.waiting import wait_for

KEY = b"runtime-test-key-0123456789abcdef"  # 32 bytes or more, as every reader requires
GPU0 = "GPU-rt-0"
NODE = """
[shared_nodes]
nvidia = ["/dev/nvidiactl:1:3"]

[[device]]
uuid = "{uuid}"
vendor = "nvidia"
model = "A100-SXM4-80GB"
index = 0
pci_bus_id = "0000:17:00.0"
vram = "80Gi"
tflops_fp16 = 312
nodes = ["/dev/nvidia0:1:3"]
"""


def runtime_hcsd(
    directory: Path,
    nri_socket: Path,
    *,
    uuid: str = GPU0,
    key: bytes | None = KEY,
    settings: Settings | None = None,
) -> Daemon:
    """hcsd (not started) in `directory` with its node file, named rt-node, serving the
    runtime at `nri_socket` with the real libhcs; `key` (unless None) is its assignment key."""
    directory.mkdir(parents=True, exist_ok=True)
    node = directory / "node.toml"
    node.write_text(NODE.format(uuid=uuid))
    runtime: dict[str, object] = {"nri_socket": nri_socket, "libhcs_path": build_libhcs()}
    if key is not None:
        key_file = directory / "assignment.key"
        key_file.write_bytes(key)
        key_file.chmod(0o600)
        runtime["assignment_key_file"] = key_file
    daemon = Daemon(
        directory, node_file=node, settings={"node": {"name": "rt-node"}, "runtime": runtime}
    )
    daemon.configure(settings or {})
    return daemon


def start_registered(daemon: Daemon) -> None:
    """Start hcsd and wait until its NRI plugin has registered with the runtime."""
    daemon.start()
    wait_for(lambda: "nri: registered" in daemon.logs(), "hcsd registered with NRI")


def allocations(daemon: Daemon) -> dict[str, dict[str, object]]:
    return {a["container_id"]: a for a in json.loads(daemon.hcsctl("--json", "allocations").stdout)}
