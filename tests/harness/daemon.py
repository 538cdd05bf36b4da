"""hcsd as a real process, started the way systemd starts it: a config file, sd_notify.

Everything hcsd writes stays in the test's directory: the API socket, the ledger, the
per-container directories, the CDI spec, the NRI sockets (nobody listens there unless a test
says so) and its log. The config is written from settings, table by table: the harness's own
(those paths, a free metrics port, the simulated node, health watching off) with a test's
overrides on top, so a test names only the keys it is about. Used by the integration, runtime,
cluster and watchdog suites and by the benchmarks.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from hcsd.daemon.reference import toml_value

ROOT = Path(__file__).resolve().parents[2]
MIXED_NODE = ROOT / "examples" / "nodes" / "mixed.toml"
LIBHCS = ROOT / "libhcs" / "build" / "libhcs.so"
NOFILE = resource.RLIMIT_NOFILE

#: {table: {key: value}}; a table such as "runtime.driver_paths" is written as a TOML table.
Settings = Mapping[str, Mapping[str, object]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_libhcs() -> Path:
    """The real libhcs (make -C libhcs), for tests whose containers run under it."""
    subprocess.run(["make", "-s", "-C", str(ROOT / "libhcs")], check=True)
    return LIBHCS


def render(settings: Settings) -> str:
    """The settings as a TOML file (paths written as strings)."""
    lines: list[str] = []
    for table, keys in settings.items():
        lines.append(f"[{table}]")
        for key, value in keys.items():
            written = str(value) if isinstance(value, Path) else value
            lines.append(f"{key} = {toml_value(written)}")
    return "\n".join(lines) + "\n"


class Daemon:
    def __init__(
        self,
        directory: Path,
        *,
        node_file: Path = MIXED_NODE,
        settings: Settings | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.dir = directory
        self.node_file = node_file
        self.socket = str(directory / "hcsd.sock")
        self.port = free_port()
        self.config = directory / "hcsd.toml"
        self.settings: dict[str, dict[str, object]] = {
            "node": {"name": "test-node"},
            "daemon": {
                "socket": self.socket,
                "state_dir": f"{directory}/state",
                "run_dir": str(directory),
                "shutdown_grace": 1,
            },
            "metrics": {"listen": f"127.0.0.1:{self.port}"},
            "discovery": {"backends": ["simulated"], "simulated_node": str(node_file)},
            "allocator": {"policy": "binpack"},
            "runtime": {
                "nri_socket": f"{directory}/nri.sock",
                "cdi_dir": f"{directory}/cdi",
                "nri_prelaunch_socket": f"{directory}/nri-prelaunch.sock",
            },
            "health": {"source": "off"},
        }
        self.configure(settings or {})
        self.notify_path = str(directory / "notify.sock")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        self.notify.settimeout(10)
        self.log = open(directory / "hcsd.log", "w+")  # noqa: SIM115
        self.process: subprocess.Popen[bytes] | None = None
        # Put before the command (tests/capabilities.setpriv_prefix: the unit's capabilities)
        self.prefix: list[str] = []

    def configure(self, settings: Settings) -> None:
        """Set keys (each table's given keys replace those it had) and rewrite the file: hcsd
        reads it when it starts and on SIGHUP."""
        for table, keys in settings.items():
            self.settings.setdefault(table, {}).update(keys)
        self.config.write_text(render(self.settings))

    def start(self, watchdog_usec: int = 0, max_files: int | None = None) -> list[str]:
        """Start hcsd (`max_files`: LimitNOFILE= as systemd sets it); the sd_notify messages
        up to READY=1 (AssertionError if none comes)."""
        env = dict(os.environ, NOTIFY_SOCKET=self.notify_path, JOURNAL_STREAM="8:1")
        if watchdog_usec:
            env["WATCHDOG_USEC"] = str(watchdog_usec)
        limit = (max_files, max_files) if max_files is not None else None
        command = [sys.executable, "-m", "hcsd.daemon.lifecycle", "--config", str(self.config)]
        self.process = subprocess.Popen(
            [*self.prefix, *command],
            env=env,
            stderr=self.log,
            stdout=self.log,
            preexec_fn=None if limit is None else lambda: resource.setrlimit(NOFILE, limit),  # noqa: PLW1509 - as systemd sets it
        )
        return self.wait_notify("READY=1")

    def wait_notify(self, needle: str) -> list[str]:
        seen = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            message = self.notify.recv(4096).decode()
            seen.append(message)
            if needle in message:
                return seen
        raise AssertionError(f"no {needle} from hcsd; got {seen}; log:\n{self.logs()}")

    def open_files(self) -> int:
        assert self.process is not None
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def logs(self) -> str:
        self.log.flush()
        return (self.dir / "hcsd.log").read_text()

    def hcsctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hcsd.cli.hcsctl", "--socket", self.socket, *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def stop(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=15)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.notify.close()
        self.log.close()
