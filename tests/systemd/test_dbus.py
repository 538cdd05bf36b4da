"""HCS's systemd client end to end over a real dbus-daemon, against the systemd stand-in:
`hcsctl setup`'s restart-and-wait, and hcsd following the runtime's unit so that its NRI
plugin re-registers the moment the runtime is active again."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from hcsd.runtime.injector import Injector
from hcsd.runtime.nri.plugin import NriPlugin
from hcsd.runtime.settings import RuntimeSection
from hcsd.systemd import (
    NotRunning,
    RestartFailed,
    RestartPending,
    RestartUnknown,
    SystemdUnavailable,
    follow_units,
    restart_unit,
    timeouts,
)
from hcsd.systemd.bus import (
    MANAGER,
    MANAGER_PATH,
    PROPERTIES,
    SystemdError,
    add_match,
    call,
    connect,
    properties_changed_rule,
    unit_path,
)
from hcsd.systemd.bus import UNIT as UNIT_INTERFACE
from hcsd.systemd.restarting import JOB_REMOVED_RULE
from tests.harness.waiting import eventually
from tests.nri.peer import RuntimePeer
from tests.systemd.conftest import DbusDaemon, Systemd, export_systemd
from tests.systemd.standin import USEC_INFINITY, Outcome

REPO = Path(__file__).resolve().parents[2]
UNIT = "containerd.service"


async def test_restart_returns_once_the_job_is_done_and_the_unit_active(systemd: Systemd) -> None:
    seconds = await restart_unit(UNIT, 5, address=systemd.address)
    unit = systemd.manager.units[UNIT]
    assert systemd.manager.restarts == [UNIT]
    assert (unit.active, unit.sub, unit.job) == ("active", "running", (0, "/"))
    # The job runs after RestartUnit's answer: stop (2 states), start (2), then JobRemoved.
    assert seconds >= 5 * systemd.manager.step


@pytest.mark.parametrize(
    ("outcome", "message"),
    [
        pytest.param(
            Outcome([("activating", "start"), ("failed", "failed")], "failed", "exit-code"),
            "containerd.service: the restart job ended 'failed'; it is failed (failed), "
            "result exit-code",
            id="start-failed",
        ),
        pytest.param(
            Outcome([("activating", "auto-restart")], "failed", "timeout"),
            "containerd.service: the restart job ended 'failed'; it is activating "
            "(auto-restart), result timeout",
            id="failed-then-auto-restart",
        ),
        pytest.param(
            Outcome([("activating", "start"), ("inactive", "dead")], "done", "success"),
            "containerd.service: restarted, then stopped; it is inactive (dead), result success",
            id="done-but-inactive",
        ),
    ],
)
async def test_a_restart_that_does_not_come_back_names_the_state_and_result(
    systemd: Systemd, outcome: Outcome, message: str
) -> None:
    systemd.manager.units[UNIT].next = outcome
    with pytest.raises(RestartFailed) as failed:
        await restart_unit(UNIT, 5, address=systemd.address)
    assert str(failed.value) == message


async def test_a_start_that_never_finishes_times_out_with_the_state(systemd: Systemd) -> None:
    systemd.manager.units[UNIT].next = Outcome([("activating", "start")], hang=True)
    began = time.monotonic()
    with pytest.raises(RestartPending) as failed:
        await restart_unit(UNIT, 0.6, address=systemd.address)
    assert 0.6 <= time.monotonic() - began < 3
    assert str(failed.value) == (
        "containerd.service: not active 0.6 s after the restart; it is activating (start), "
        "result success; systemd is still working on it"
    )


async def test_the_wait_is_the_units_stop_and_start_timeouts_and_a_margin(
    systemd: Systemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(timeouts, "MARGIN", 0.1)
    unit = systemd.manager.units[UNIT]
    unit.next = Outcome([("activating", "start")], hang=True)
    unit.service.timeout_stop, unit.service.timeout_start = 200_000, 300_000  # 0.2 s, 0.3 s
    began = time.monotonic()
    with pytest.raises(RestartPending, match=r"not active 0.6 s after the restart; it is activ"):
        await restart_unit(UNIT, address=systemd.address)
    assert 0.6 <= time.monotonic() - began < 3


async def test_an_infinite_start_timeout_waits_until_the_job_ends_or_the_users_limit(
    systemd: Systemd,
) -> None:
    """CRI-O's upstream unit: TimeoutStartSec=0, infinity."""
    unit = systemd.manager.units[UNIT]
    unit.next = Outcome([("activating", "start")], hang=True)
    unit.service.timeout_start = USEC_INFINITY
    restart = asyncio.create_task(restart_unit(UNIT, address=systemd.address))
    await asyncio.sleep(2)  # no deadline of its own: still waiting for the job
    assert not restart.done()
    restart.cancel()
    await asyncio.gather(restart, return_exceptions=True)
    with pytest.raises(RestartPending, match=r"not active 0.4 s after the restart"):
        await restart_unit(UNIT, 0.4, address=systemd.address)


async def test_hcsctl_setup_exits_4_while_systemd_is_still_restarting(
    tmp_path: Path, systemd: Systemd
) -> None:
    systemd.manager.units[UNIT].next = Outcome([("activating", "start")], hang=True)
    rc, out = await hcsctl(tmp_path, systemd.address, "--restart", "--restart-timeout", "0.5")
    assert rc == 4, out
    assert (
        "hcsctl: containerd.service: not active 0.5 s after the restart; it is activating "
        "(start), result success; systemd is still working on it; see systemctl status "
        "containerd.service"
    ) in out


async def test_an_unknown_unit_is_refused_with_systemds_words(systemd: Systemd) -> None:
    with pytest.raises(
        RestartFailed,
        match=r"crio.service: systemd refused the restart: "
        r"Unit crio.service not found. \(org.freedesktop.systemd1.NoSuchUnit\)",
    ):
        await restart_unit("crio.service", 5, address=systemd.address)  # fmt: skip


async def test_a_bus_without_systemd_is_unavailable(dbus_address: str) -> None:
    with pytest.raises(SystemdUnavailable, match="no systemd on the system D-Bus"):
        await restart_unit(UNIT, 5, address=dbus_address)


async def test_no_bus_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(SystemdUnavailable, match="no system D-Bus: No such file or directory"):
        await restart_unit(UNIT, 5, address=f"unix:path={tmp_path}/none")


async def test_signals_need_subscribe_as_in_systemd(systemd: Systemd) -> None:
    """The stand-in keeps systemd's rule: a client that never subscribed hears nothing."""
    bus = await connect(systemd.address)
    heard: list[str] = []
    bus.add_message_handler(
        lambda m: heard.append(str(m.member)) if m.message_type == MessageType.SIGNAL else None
    )
    await add_match(bus, properties_changed_rule(unit_path(UNIT)))
    await add_match(bus, JOB_REMOVED_RULE)
    heard.clear()  # NameAcquired, sent by the bus itself to every new connection
    assert systemd.manager.subscribers == 0
    systemd.manager.restart_outside(UNIT)
    while systemd.manager.jobs:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    assert heard == []  # matched, but never subscribed
    await call(bus, MANAGER_PATH, MANAGER, "Subscribe")
    assert systemd.manager.subscribers == 1
    systemd.manager.restart_outside(UNIT)
    # the signals pass through dbus-daemon after the job has left the stand-in's table
    await eventually(lambda: "PropertiesChanged" in heard and "JobRemoved" in heard,
                     "the subscriber heard the signals", timeout=10)  # fmt: skip
    with pytest.raises(SystemdError, match="NoSuchUnit"):
        await call(bus, MANAGER_PATH, MANAGER, "GetUnit", "s", "crio.service")
    bus.disconnect()


async def others(forger: MessageBus, known: set[str | None]) -> list[str]:
    """The unique names on the bus but `known`'s: the client under test."""
    (names,) = await call(
        forger, "/org/freedesktop/DBus", "org.freedesktop.DBus", "ListNames",
        destination="org.freedesktop.DBus",
    )  # fmt: skip
    return [n for n in names if n.startswith(":") and n not in known]


def forged(
    target: str, path: str, interface: str, member: str, signature: str, *body: object
) -> Message:
    """A signal with systemd's path, interface and member, sent by another client straight to
    `target` (the bus lets any client do that)."""
    return Message(
        message_type=MessageType.SIGNAL, destination=target, path=path, interface=interface,
        member=member, signature=signature, body=list(body),
    )  # fmt: skip


def forged_state(target: str, active: str, sub: str) -> Message:
    changed = {"ActiveState": Variant("s", active), "SubState": Variant("s", sub)}
    return forged(
        target, unit_path(UNIT), PROPERTIES, "PropertiesChanged", "sa{sv}as",
        UNIT_INTERFACE, changed, [],
    )  # fmt: skip


async def test_a_restart_ignores_signals_forged_by_another_client(systemd: Systemd) -> None:
    forger = await connect(systemd.address)
    known = {systemd.bus.unique_name, forger.unique_name}
    restart = asyncio.create_task(restart_unit(UNIT, 5, address=systemd.address))
    while not (targets := await others(forger, known)):
        await asyncio.sleep(0.002)
    job = "/org/freedesktop/systemd1/job/1"  # the stand-in's first job, as the restart's is
    for target in targets:
        await forger.send(forged(target, MANAGER_PATH, MANAGER, "JobRemoved", "us", 1, UNIT))
        await forger.send(
            forged(target, MANAGER_PATH, MANAGER, "JobRemoved", "uoss", 1, job, UNIT, "failed")
        )
        await forger.send(forged_state(target, "failed", "failed"))
    await restart  # neither a traceback nor a RestartFailed: the forged signals were dropped
    assert systemd.manager.units[UNIT].active == "active"
    forger.disconnect()


async def test_following_ignores_signals_forged_by_another_client(systemd: Systemd) -> None:
    back: list[str] = []
    ready = asyncio.Event()
    follow = asyncio.create_task(
        follow_units([UNIT], lambda unit, state: back.append(state), address=systemd.address,
                     connected=ready.set)
    )  # fmt: skip
    try:
        await asyncio.wait_for(ready.wait(), 5)
        forger = await connect(systemd.address)
        (target,) = await others(forger, {systemd.bus.unique_name, forger.unique_name})
        await forger.send(
            forged(target, unit_path(UNIT), PROPERTIES, "PropertiesChanged", "s", UNIT_INTERFACE)
        )
        await forger.send(forged_state(target, "active", "running"))
        await asyncio.sleep(0.3)
        assert back == []
        systemd.manager.restart_outside(UNIT)  # systemd's own still count
        for _ in range(300):
            if len(back) == 2:
                break
            await asyncio.sleep(0.01)
        assert back == ["activating", "active"]
        forger.disconnect()
    finally:
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)


async def test_following_hears_systemd_after_it_re_executes(dbus_address: str) -> None:
    """daemon-reexec: systemd's name gets a new unique owner (NameOwnerChanged); its signals
    count, on the same connection, without reconnecting."""
    old = await export_systemd(dbus_address)
    back: list[str] = []
    ready = asyncio.Event()
    follow = asyncio.create_task(
        follow_units([UNIT], lambda unit, state: back.append(state), address=dbus_address,
                     connected=ready.set)
    )  # fmt: skip
    new: Systemd | None = None
    try:
        await asyncio.wait_for(ready.wait(), 5)
        ready.clear()
        await old.close()
        new = await export_systemd(dbus_address)
        new.manager.subscribers = 1  # systemd keeps its subscribers across a re-exec
        await asyncio.sleep(0.1)
        new.manager.restart_outside(UNIT)
        for _ in range(300):
            if len(back) == 2:
                break
            await asyncio.sleep(0.01)
        assert back == ["activating", "active"]
        assert not ready.is_set()  # the same connection: no reconnect
    finally:
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)
        if new is not None:
            await new.close()


async def hcsctl(
    tmp_path: Path, address: str, *args: str, runtime: str = "containerd", yes: bool = True
) -> tuple[int, str]:
    config = tmp_path / "root/etc/containerd/config.toml"
    if not config.exists():
        config.parent.mkdir(parents=True)
        config.write_text("version = 3\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hcsd.cli.hcsctl", "setup", runtime, *(["--yes"] if yes else []),
        "--root", str(tmp_path / "root"), *args,
        env={**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": address},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=REPO,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode()


async def test_hcsctl_setup_restarts_containerd_and_waits(tmp_path: Path, systemd: Systemd) -> None:
    rc, out = await hcsctl(tmp_path, systemd.address, "--restart")
    assert rc == 0, out
    assert "restarting containerd.service through systemd" in out
    assert "containerd.service is active again (" in out
    assert systemd.manager.restarts == [UNIT]
    # Set up already: nothing changes, but an explicit --restart is done (a restart that
    # failed or was skipped is finished by running setup again).
    rc, out = await hcsctl(tmp_path, systemd.address, "--restart")
    assert (rc, systemd.manager.restarts) == (0, [UNIT, UNIT]), out
    assert "nothing to change" in out and "containerd.service is active again (" in out
    rc, out = await hcsctl(tmp_path, systemd.address)  # --root: no restart unless asked
    assert (rc, systemd.manager.restarts) == (0, [UNIT, UNIT]), out


async def test_hcsctl_setup_restarts_a_runtime_that_started_before_its_files(
    tmp_path: Path, systemd: Systemd
) -> None:
    """On the host itself (--root /): nothing to write, but containerd's main process started
    before the drop-in was written (ExecMainStartTimestamp): restarted with --yes, else the
    operator is told; once it started after, nothing is done."""
    etc = tmp_path / "root/etc/containerd"
    live = ("--root", "/", "--config", f"{etc}/config.toml", "--drop-in-dir", f"{etc}/conf.d")
    rc, out = await hcsctl(tmp_path, systemd.address, *live, "--no-restart")
    assert (rc, systemd.manager.restarts) == (0, []), out
    rc, out = await hcsctl(tmp_path, systemd.address, *live, yes=False)
    assert (rc, systemd.manager.restarts) == (0, []), out
    drop_in = f"{etc}/conf.d/10-hcsd-nri.toml"
    assert f"containerd.service started before {drop_in} was written: it runs without it" in out
    assert "restart it: systemctl restart containerd.service" in out
    rc, out = await hcsctl(tmp_path, systemd.address, *live)
    assert (rc, systemd.manager.restarts) == (0, [UNIT]), out
    assert "nothing to change" in out and "containerd.service is active again (" in out
    rc, out = await hcsctl(tmp_path, systemd.address, *live)
    assert (rc, systemd.manager.restarts) == (0, [UNIT]), out
    assert "started before" not in out


async def test_hcsctl_setup_says_to_run_as_root_when_polkit_refuses(
    tmp_path: Path, systemd: Systemd
) -> None:
    denied = "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired"
    systemd.manager.refuse["RestartUnit"] = denied
    rc, out = await hcsctl(tmp_path, systemd.address, "--restart")
    assert rc == 1 and "Traceback" not in out, out
    assert "containerd.service: not allowed to restart it (RestartUnit refused (test)); " in out
    assert "run as root (sudo)" in out


async def test_hcsctl_setup_names_a_systemd_error_before_the_restart(
    tmp_path: Path, systemd: Systemd
) -> None:
    systemd.manager.refuse["Subscribe"] = "org.freedesktop.DBus.Error.AccessDenied"
    rc, out = await hcsctl(tmp_path, systemd.address, "--restart")
    assert rc == 1 and "Traceback" not in out, out
    assert (
        "hcsctl: cannot restart containerd.service through systemd: Subscribe refused (test) "
        "(org.freedesktop.DBus.Error.AccessDenied); run as root (sudo)"
    ) in out
    assert systemd.manager.restarts == []


async def test_hcsctl_setup_interrupted_says_so_without_a_traceback(
    tmp_path: Path, systemd: Systemd
) -> None:
    systemd.manager.units[UNIT].next = Outcome([("activating", "start")], hang=True)
    config = tmp_path / "root/etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("version = 3\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hcsd.cli.hcsctl", "setup", "containerd", "--yes", "--restart",
        "--root", str(tmp_path / "root"),
        env={**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": systemd.address},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=REPO,
    )  # fmt: skip
    while not systemd.manager.restarts:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    os.kill(process.pid, signal.SIGINT)  # our own child, by its pid: Ctrl-C
    out = (await asyncio.wait_for(process.communicate(), 30))[0].decode()
    assert process.returncode == 130 and "Traceback" not in out, out
    assert (
        "hcsctl: interrupted; the restart of containerd.service may already be under way: "
        "systemctl status containerd.service"
    ) in out


async def test_the_bus_going_away_during_the_wait_ends_it_as_unknown(tmp_path: Path) -> None:
    """The restart is queued, then dbus goes: the wait ends at once (not at its timeout) with
    its outcome unknown, which hcsctl exits 3 for."""
    daemon = DbusDaemon(tmp_path)
    stand_in = await export_systemd(daemon.address)
    stand_in.manager.units[UNIT].next = Outcome([("activating", "start")], hang=True)
    restart = asyncio.create_task(restart_unit(UNIT, 30, address=daemon.address))
    try:
        while not stand_in.manager.restarts:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        began = time.monotonic()
        daemon.stop()
        with pytest.raises(RestartUnknown, match="the restart was requested, but its outcome"):
            await asyncio.wait_for(restart, 5)
        assert time.monotonic() - began < 2
    finally:
        await stand_in.close()
        daemon.stop()


async def test_hcsctl_setup_crio_restarts_crio(tmp_path: Path, systemd: Systemd) -> None:
    crio = systemd.manager.load("crio.service")
    systemd.bus.export(unit_path(crio.id), crio)
    systemd.bus.export(unit_path(crio.id), crio.service)
    rc, out = await hcsctl(tmp_path, systemd.address, "--restart", runtime="crio")
    assert rc == 0, out
    assert "crio.service is active again (" in out
    assert systemd.manager.restarts == ["crio.service"]


async def test_hcsctl_setup_says_why_the_restart_failed(tmp_path: Path, systemd: Systemd) -> None:
    systemd.manager.units[UNIT].next = Outcome(
        [("activating", "start"), ("failed", "failed")], "failed", "exit-code"
    )
    rc, out = await hcsctl(tmp_path, systemd.address, "--restart")
    assert rc == 1
    assert (
        "hcsctl: containerd.service: the restart job ended 'failed'; it is failed (failed), "
        "result exit-code; see journalctl -u containerd.service"
    ) in out
    etc = tmp_path / "root/etc/containerd"
    assert re.search(
        rf"hcsctl: to go back to the configuration before: rm {etc}/conf.d/10-hcsd-nri.toml; "
        rf"cp -p {etc}/config.toml.hcs-backup-\d+ {etc}/config.toml; "
        rf"systemctl restart containerd.service",
        out,
    ), out


async def test_a_stopped_runtime_is_left_stopped(tmp_path: Path, systemd: Systemd) -> None:
    """TryRestartUnit, not RestartUnit: the operator's stopped containerd is not started."""
    unit = systemd.manager.units[UNIT]
    unit.active, unit.sub = "inactive", "dead"
    with pytest.raises(NotRunning) as stopped:
        await restart_unit(UNIT, 5, address=systemd.address)
    assert str(stopped.value) == (
        "containerd.service is not running (inactive (dead), result success), so nothing was "
        "restarted; the configuration applies when it next starts"
    )
    assert (unit.active, systemd.manager.restarts) == ("inactive", [])
    rc, out = await hcsctl(tmp_path, systemd.address, "--restart")
    assert rc == 0 and "containerd.service is not running (inactive (dead)" in out, out
    assert (unit.active, systemd.manager.restarts) == ("inactive", [])
    unit.active, unit.sub = "failed", "failed"  # failed is stopped too
    rc, out = await hcsctl(tmp_path, systemd.address, "--restart")
    assert rc == 0 and "containerd.service is not running (failed (failed)" in out, out
    assert systemd.manager.restarts == []


async def test_hcsctl_setup_without_systemd_says_what_to_restart(
    tmp_path: Path, dbus_address: str
) -> None:
    rc, out = await hcsctl(tmp_path, dbus_address, "--restart")
    assert rc == 0, out  # the configuration is written; the restart is the operator's
    assert "cannot restart containerd through systemd: no systemd on the system D-Bus" in out
    assert "(under systemd: systemctl restart containerd.service)" in out
    rc, out = await hcsctl(tmp_path / "other", dbus_address)  # --root: no restart by default
    assert rc == 0 and "now restart containerd: systemctl restart containerd" in out


async def test_hcsctl_setup_with_a_bogus_bus_address_says_so_in_one_line(tmp_path: Path) -> None:
    rc, out = await hcsctl(tmp_path, "bogus", "--restart")
    assert rc == 0 and "Traceback" not in out, out  # written; the restart is the operator's
    assert "hcsctl: cannot restart containerd through systemd: cannot use the system D-Bus: " in out


async def test_following_calls_back_when_the_unit_starts_and_when_it_is_active(
    systemd: Systemd,
) -> None:
    back: list[tuple[str, str]] = []
    ready = asyncio.Event()
    follow = asyncio.create_task(
        follow_units(
            [UNIT, "crio.service"],
            lambda unit, state: back.append((unit, state)),
            address=systemd.address,
            connected=ready.set,
        )
    )
    await asyncio.wait_for(ready.wait(), 5)
    for _ in range(2):
        began = time.monotonic()
        systemd.manager.restart_outside(UNIT)
        while len(back) < 2 * (1 + _):
            await asyncio.sleep(0.01)
            assert time.monotonic() - began < 5, "no callback"
    await asyncio.sleep(0.2)  # the job's last PropertiesChanged (active again) adds nothing
    assert back == [(UNIT, "activating"), (UNIT, "active")] * 2
    follow.cancel()
    await asyncio.gather(follow, return_exceptions=True)


async def test_following_an_alias_hears_its_unit(systemd: Systemd) -> None:
    """An alias signals under its unit's object path, not under the one its name escapes to:
    LoadUnit resolves it, as systemd does."""
    systemd.manager.aliases["docker-containerd.service"] = UNIT
    back: list[tuple[str, str]] = []
    ready = asyncio.Event()
    follow = asyncio.create_task(
        follow_units(["docker-containerd.service"], lambda unit, state: back.append((unit, state)),
                     address=systemd.address, connected=ready.set)
    )  # fmt: skip
    try:
        await asyncio.wait_for(ready.wait(), 5)
        systemd.manager.restart_outside(UNIT)
        for _ in range(300):
            if len(back) == 2:
                break
            await asyncio.sleep(0.01)
        alias = "docker-containerd.service"
        assert back == [(alias, "activating"), (alias, "active")]
    finally:
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)


async def test_following_survives_the_bus_going_away_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hcsd.systemd.following")
    daemon = DbusDaemon(tmp_path)
    stand_in = await export_systemd(daemon.address)
    back: list[str] = []
    ready = asyncio.Event()
    follow = asyncio.create_task(
        follow_units([UNIT], lambda unit, state: back.append(state), address=daemon.address,
                     connected=ready.set,
                     retry=0.05)
    )  # fmt: skip
    try:
        await asyncio.wait_for(ready.wait(), 5)
        ready.clear()
        daemon.stop()  # dbus restarted under us
        await stand_in.close()

        def said() -> list[str]:
            return [r.getMessage() for r in caplog.records if "not following" in r.getMessage()]

        await eventually(lambda: len(said()) >= 2, "both losses said", timeout=10)
        await asyncio.sleep(0.5)  # ~10 failed retries more
        lines = said()
        assert len(lines) == 2, lines  # the connection closed; then no bus, said once
        assert "(the system D-Bus connection closed)" in lines[0]
        assert "(no system D-Bus: " in lines[1]
        daemon = DbusDaemon(tmp_path)  # back, on the same socket
        stand_in = await export_systemd(daemon.address)
        await asyncio.wait_for(ready.wait(), 5)
        stand_in.manager.restart_outside(UNIT)
        for _ in range(500):
            if len(back) == 2:
                break
            await asyncio.sleep(0.01)
        assert back == ["activating", "active"]
    finally:
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)
        await stand_in.close()
        daemon.stop()


async def test_the_nri_plugin_registers_again_as_soon_as_the_runtime_is_active(
    tmp_path: Path, systemd: Systemd, nri_node_injector: Injector
) -> None:
    """containerd restarts; the plugin is in a 5 s backoff; systemd says containerd is starting;
    the plugin registers within a fraction of a second, not at the end of the backoff."""
    socket = tmp_path / "nri.sock"
    registered: list[float] = []
    peers: list[RuntimePeer] = []

    async def runtime(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = RuntimePeer(reader, writer)
        peers.append(peer)
        await peer.registered.wait()
        registered.append(time.monotonic())

    server = await asyncio.start_unix_server(runtime, path=str(socket))
    plugin = NriPlugin(
        nri_node_injector,
        RuntimeSection(nri_socket=str(socket)),
        backoff=(5.0, 10.0),
    )
    ready = asyncio.Event()
    tasks = [
        asyncio.create_task(plugin.run()),
        asyncio.create_task(
            follow_units([UNIT], plugin.runtime_changed, address=systemd.address,
                         connected=ready.set)
        ),
    ]  # fmt: skip
    await asyncio.wait_for(ready.wait(), 5)
    while not registered:
        await asyncio.sleep(0.01)
    # containerd stops: its NRI socket goes, the session ends, the plugin waits 5 s.
    server.close()
    for peer in peers:
        peer.close()
    await server.wait_closed()
    socket.unlink(missing_ok=True)
    began = time.monotonic()
    systemd.manager.restart_outside(UNIT)
    server = await asyncio.start_unix_server(runtime, path=str(socket))  # the new containerd
    while len(registered) < 2:
        await asyncio.sleep(0.01)
        assert time.monotonic() - began < 4, "the plugin waited out its backoff"
    took = registered[1] - began
    print(f"re-registered {took:.3f} s after the restart began (the unit is active 0.2 s after)")
    assert took < 1.0
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    server.close()
    for peer in peers:
        peer.close()
