"""What hcsd tells systemd over NOTIFY_SOCKET when it cannot start: the reason, as STATUS."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from hcsd.daemon import notify
from hcsd.daemon.lifecycle import main
from tests.harness.daemon import MIXED_NODE, render


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket standing for systemd's, named in NOTIFY_SOCKET."""
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(path))
        server.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        yield server


@pytest.fixture
def root_logging() -> Iterator[None]:
    """main() configures the root logger for the daemon; put the test's back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_config_error_is_the_status_and_an_error_in_the_journal(
    notify_socket: socket.socket,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "hcsd.toml"
    config.write_text("[daemon]\nbogus_key = 1\n[allocator]\npolicy = 'random'\n")
    monkeypatch.setenv("JOURNAL_STREAM", "8:1")
    assert main(["--config", str(config)]) == 2
    status = notify_socket.recv(4096).decode()
    assert status.startswith(f"STATUS=failed: {config}: daemon.bogus_key: unknown key")
    assert f"; {config}: allocator.policy: expected one of binpack, spread" in status
    assert "\n" not in status  # one STATUS line, whatever the file holds
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(line.startswith(f"<3>hcsd: {config}: ") for line in lines)


def test_a_start_up_error_is_the_status(
    notify_socket: socket.socket, tmp_path: Path, root_logging: None
) -> None:
    (tmp_path / "state").write_text("a file where the ledger's directory should be")
    config = tmp_path / "hcsd.toml"
    config.write_text(
        render(
            {
                "daemon": {
                    "state_dir": tmp_path / "state",
                    "run_dir": tmp_path,
                    "socket": tmp_path / "hcsd.sock",
                },
                "metrics": {"listen": ""},
                "discovery": {"backends": ["simulated"], "simulated_node": MIXED_NODE},
                "health": {"source": "off"},
                "runtime": {"cdi_dir": ""},
            }
        )
    )
    assert main(["--config", str(config)]) == 1
    status = notify_socket.recv(4096).decode()
    assert status.startswith("STATUS=failed: failed to open the ledger: ")
    assert f"{tmp_path}/state" in status


def test_control_characters_in_a_reason_cannot_add_assignments(
    notify_socket: socket.socket,
) -> None:
    notify.failed("bad key 'x\nREADY=1'")
    assert notify_socket.recv(4096).decode() == "STATUS=failed: bad key 'x\\nREADY=1'"
