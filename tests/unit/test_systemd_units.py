"""systemd over D-Bus without a bus: unit paths, what counts as "back", how a restart ends, the
fallback without D-Bus, and the NRI plugin's backoff cut short when the runtime is back."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from hcsd.discovery import Inventory
from hcsd.runtime.nri.plugin import NriPlugin
from hcsd.runtime.settings import RuntimeSection
from hcsd.systemd import ActiveEdges, RestartWait, UnitState, follow_units, unit_path
from tests.harness.local import local_node
from tests.nri.peer import RuntimePeer

JOB = "/org/freedesktop/systemd1/job/7"


@pytest.mark.parametrize(
    ("name", "path"),
    [
        pytest.param("containerd.service", "containerd_2eservice", id="dot"),
        # systemd's own example in org.freedesktop.systemd1(5)
        pytest.param("avahi-daemon.service", "avahi_2ddaemon_2eservice", id="dash"),
        pytest.param("crio.service", "crio_2eservice", id="crio"),
        pytest.param("1st.service", "_31st_2eservice", id="leading-digit"),
        pytest.param("a_b@2.service", "a_5fb_402_2eservice", id="underscore-at-digit"),
        pytest.param("", "_", id="empty"),
    ],
)
def test_unit_paths_follow_systemds_escaping(name: str, path: str) -> None:
    assert unit_path(name) == "/org/freedesktop/systemd1/unit/" + path


@pytest.mark.parametrize(
    ("states", "back"),
    [
        pytest.param(["deactivating", "inactive", "activating", "active"], [2, 3], id="restart"),
        pytest.param(["active", "active", "reloading", "active"], [0, 3], id="first-and-reload"),
        pytest.param(
            ["activating", "activating", "failed", "activating", "active"], [0, 3, 4],
            id="failed-then-up",
        ),
        pytest.param(["inactive", "deactivating", "inactive"], [], id="never-up"),
    ],
)  # fmt: skip
def test_news_is_activating_or_active_after_anything_else(
    states: list[str], back: list[int]
) -> None:
    edges = ActiveEdges(["containerd.service"])
    path = unit_path("containerd.service")
    seen = [i for i, state in enumerate(states) if edges.saw(path, state)]
    assert seen == back
    assert edges.saw(unit_path("other.service"), "active") is None


@pytest.mark.parametrize(
    ("events", "back", "failure"),
    [
        pytest.param(
            [("state", "active", "running"), ("job", JOB, "done")], True, None, id="done-active"
        ),
        pytest.param(
            [("job", JOB, "done"), ("state", "activating", "start")], False, None, id="still-up"
        ),
        pytest.param(
            [("state", "failed", "failed")], False, None, id="old-failed-state-decides-nothing"
        ),
        pytest.param(
            [("state", "active", "running"), ("job", "/other/job", "done")], False, None,
            id="another-job",
        ),
        pytest.param(
            [("state", "failed", "failed"), ("job", JOB, "failed")], False,
            "u.service: the restart job ended 'failed'; it is failed (failed), result exit-code",
            id="job-failed",
        ),
        pytest.param(
            [("job", JOB, "timeout"), ("state", "activating", "start")], False,
            "u.service: the restart job ended 'timeout'; it is activating (start), result "
            "exit-code",
            id="job-timeout",
        ),
        pytest.param(
            [("job", JOB, "done"), ("state", "inactive", "dead")], False,
            "u.service: restarted, then stopped; it is inactive (dead), result exit-code",
            id="done-then-stopped",
        ),
    ],
)  # fmt: skip
def test_a_restart_is_over_when_its_job_is_done_and_the_unit_active(
    events: list[tuple[str, str, str]], back: bool, failure: str | None
) -> None:
    wait = RestartWait("u.service", JOB)
    wait.saw(UnitState("active", "running", "exit-code"))
    for kind, a, b in events:
        if kind == "job":
            wait.job_removed(a, b)
        else:
            wait.saw_change(UnitState(a, b))
    assert wait.back() is back
    assert wait.failure() == failure


@pytest.mark.parametrize(
    ("state", "text"),
    [
        (UnitState("active", "running", "success"), "active (running), result success"),
        (UnitState("failed", "failed", "exit-code"), "failed (failed), result exit-code"),
        (UnitState("inactive"), "inactive"),
    ],
)
def test_states_read_as_systemctl_status_shows_them(state: UnitState, text: str) -> None:
    assert state.describe() == text


async def test_without_a_bus_the_reason_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hcsd.systemd.following")
    follow = asyncio.create_task(
        follow_units(
            ["containerd.service"], lambda unit, state: None, address=f"unix:path={tmp_path}/none",
            retry=0.01,
        )
    )  # fmt: skip
    await asyncio.sleep(0.3)  # many retries
    follow.cancel()
    await asyncio.gather(follow, return_exceptions=True)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "not following containerd.service over D-Bus (no system D-Bus: No such file or "
        "directory); after a runtime restart the NRI plugin reconnects on its backoff; "
        "retrying every 0.01 s"
    ]


async def _registrations(
    tmp_path: Path,
    inventory: Inventory,
    *,
    wake_after: float | None,
    listen_after: float,
    state: str = "active",
) -> float:
    """A plugin with a 5 s backoff and no runtime socket yet; the socket listens after
    `listen_after` s, runtime_changed(state) is called after `wake_after` s (None: never).
    Returns the seconds until the plugin registered (or 3.0 if it had not by then)."""
    socket = tmp_path / "nri.sock"
    node = local_node(tmp_path / "node", inventory)
    plugin = NriPlugin(node.injector(), RuntimeSection(nri_socket=str(socket)), backoff=(5, 10))
    registered = asyncio.Event()
    peers: list[RuntimePeer] = []

    async def runtime(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(RuntimePeer(reader, writer))
        await peers[-1].registered.wait()
        registered.set()

    began = time.monotonic()
    run = asyncio.create_task(plugin.run())
    server = None
    try:
        steps = sorted([("listen", listen_after)] + ([("wake", wake_after)] if wake_after else []),
                       key=lambda s: s[1])  # fmt: skip
        for what, at in steps:
            await asyncio.sleep(max(0.0, began + at - time.monotonic()))
            if what == "listen":
                server = await asyncio.start_unix_server(runtime, path=str(socket))
            else:
                plugin.runtime_changed("containerd.service", state)
        try:
            await asyncio.wait_for(registered.wait(), began + 3.0 - time.monotonic())
        except TimeoutError:
            return 3.0
        return time.monotonic() - began
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        for peer in peers:
            peer.close()
        if server is not None:
            server.close()
        node.close()


@pytest.mark.parametrize(
    ("wake_after", "listen_after", "state", "low", "high"),
    [
        pytest.param(None, 0.2, "active", 3.0, 3.0, id="backoff-alone-waits"),
        pytest.param(0.3, 0.2, "active", 0.3, 0.6, id="active-when-listening"),
        pytest.param(0.2, 0.5, "active", 0.5, 0.8, id="active-before-the-socket-listens"),
        pytest.param(0.2, 1.2, "activating", 1.2, 1.5, id="starting-then-the-socket-listens"),
    ],
)
async def test_news_of_the_runtimes_unit_cuts_the_backoff_short(
    tmp_path: Path,
    mixed_inventory: Inventory,
    wake_after: float | None,
    listen_after: float,
    state: str,
    low: float,
    high: float,
) -> None:
    took = await _registrations(
        tmp_path, mixed_inventory, wake_after=wake_after, listen_after=listen_after, state=state
    )
    assert low <= took <= high, took
