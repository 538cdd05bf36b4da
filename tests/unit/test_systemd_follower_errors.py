"""Following the runtime's unit is an extra: no error of it, nor a missing dbus-fast, may end
hcsd, whose tasks are all roots of run_tasks (one ending stops the daemon)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import pytest

from hcsd.daemon import lifecycle
from hcsd.systemd import following
from hcsd.tasks import run_tasks, supervise


async def _runs_on(follower: asyncio.Task[None]) -> None:
    """run_tasks over the follower and a stand-in for hcsd's signal task: still running after
    the follower's failures, and ending cleanly when the stand-in ends."""
    stop = asyncio.Event()
    daemon = asyncio.create_task(run_tasks([supervise(stop.wait(), "signals"), follower]))
    await asyncio.sleep(0.3)
    assert not daemon.done(), daemon.exception() if daemon.done() else None
    stop.set()
    await asyncio.wait_for(daemon, 5)


async def test_an_unexpected_error_of_the_follower_leaves_hcsd_running(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tries: list[str | None] = []

    async def broken(address: str | None = None) -> None:
        tries.append(address)
        raise RuntimeError(f"try {len(tries)}")  # a different text each time

    monkeypatch.setattr(following, "connect", broken)
    caplog.set_level(logging.INFO, logger="hcsd.systemd.following")
    follower = supervise(
        following.follow_units(["containerd.service"], lambda u, s: None, retry=0.02),
        "nri-runtime-units",
    )
    await _runs_on(follower)
    assert len(tries) > 3  # retried
    lines = [r for r in caplog.records if "not following" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]  # once per kind of error
    assert lines[0].levelno == logging.WARNING and "RuntimeError: try 1" in lines[0].getMessage()


async def test_hcsd_without_dbus_fast_says_so_and_keeps_running(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "hcsd.systemd", None)  # import raises ImportError
    caplog.set_level(logging.INFO, logger="hcsd.daemon.lifecycle")
    follower = supervise(
        lifecycle._follow_runtime(("containerd.service",), None),  # type: ignore[arg-type]
        "nri-runtime-units",
    )
    await _runs_on(follower)
    assert [r.getMessage() for r in caplog.records if "not following" in r.getMessage()] == [
        "not following containerd.service over D-Bus (import of hcsd.systemd halted; None in "
        "sys.modules); after a runtime restart the NRI plugin reconnects on its backoff"
    ]


def test_the_daemon_does_not_load_dbus_fast_until_it_follows() -> None:
    """hcsd's modules, the NRI plugin's included, import no dbus-fast: only the follower task,
    started after READY=1, does (imports block the loop before the pre-launch socket's bind)."""
    code = (
        "import sys; import hcsd.daemon.lifecycle, hcsd.runtime.nri.plugin, hcsd.cli.hcsctl; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'dbus_fast' "
        "or m.startswith('hcsd.systemd')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
