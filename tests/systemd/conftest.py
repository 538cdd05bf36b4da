"""A private dbus-daemon (Debian's `dbus`) on a socket of the test's own, and the systemd
stand-in exported on it at org.freedesktop.systemd1."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dbus_fast.aio import MessageBus

from hcsd.discovery import Inventory
from hcsd.runtime.injector import Injector
from hcsd.systemd.bus import MANAGER_PATH, SYSTEMD, unit_path
from tests.harness.local import local_node
from tests.systemd.standin import Manager

CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"""


class DbusDaemon:
    """One dbus-daemon child of this test, listening on `socket`; stop() ends it (by its pid)."""

    def __init__(self, directory: Path) -> None:
        daemon = shutil.which("dbus-daemon")
        if daemon is None:
            pytest.skip("SKIP: no dbus-daemon (apt install dbus; scripts/install-test-deps)")
        self.socket = directory / "bus"
        self.socket.unlink(missing_ok=True)
        config = directory / "bus.conf"
        config.write_text(CONFIG.format(socket=self.socket))
        # --print-address: one line once the daemon listens, the sign that it is ready.
        self.process = subprocess.Popen(
            [daemon, f"--config-file={config}", "--nofork", "--nopidfile", "--print-address=1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.process.stdout is not None
        if not self.process.stdout.readline():
            err = self.process.stderr.read().decode() if self.process.stderr else ""
            self.stop()
            pytest.fail(f"dbus-daemon did not start: {err}")
        self.address = f"unix:path={self.socket}"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)  # our own child, by its pid
            self.process.wait(5)


@pytest.fixture
def dbus_address(tmp_path: Path) -> Iterator[str]:
    """A dbus-daemon of this test's own; its address (unix:path=...)."""
    daemon = DbusDaemon(tmp_path)
    try:
        yield daemon.address
    finally:
        daemon.stop()


@dataclass
class Systemd:
    """The stand-in as exported: its Manager, and the bus address to reach it."""

    manager: Manager
    address: str
    bus: MessageBus

    async def close(self) -> None:
        for job in list(self.manager.jobs):
            job.cancel()
        await asyncio.gather(*self.manager.jobs, return_exceptions=True)
        self.bus.disconnect()


async def export_systemd(address: str) -> Systemd:
    """systemd's stand-in on the bus at `address`, with containerd.service loaded and active."""
    bus = await MessageBus(bus_address=address).connect()
    manager = Manager()
    bus.export(MANAGER_PATH, manager)
    unit = manager.load("containerd.service")
    bus.export(unit_path(unit.id), unit)
    bus.export(unit_path(unit.id), unit.service)
    await bus.request_name(SYSTEMD)
    return Systemd(manager, address, bus)


@pytest.fixture
async def systemd(dbus_address: str) -> AsyncIterator[Systemd]:
    stand_in = await export_systemd(dbus_address)
    yield stand_in
    await stand_in.close()


@pytest.fixture
def nri_node_injector(tmp_path: Path, mixed_inventory: Inventory) -> Iterator[Injector]:
    """A real injector over a local node (the plugin's registration never uses it)."""
    node = local_node(tmp_path / "node", mixed_inventory)
    yield node.injector()
    node.close()
