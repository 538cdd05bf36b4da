"""Restart a unit through systemd and wait until it is active again, as `systemctl restart` does.

RestartUnit only queues a job and answers with its path. The restart is over when systemd
removes that job (the JobRemoved signal, with its result); the unit is back when, after that,
its ActiveState is `active`. A job that ends `done` with the unit still `activating` (a
service whose start is not finished, an automatic restart) is waited for through the unit's
PropertiesChanged signals. Anything else is `RestartFailed` (a wait that ends with the job
still running, `RestartPending`), whose message names the unit's state and result as
`systemctl status` would show them.

The signals are subscribed to before the restart is asked for, so none of them is missed; only
those whose sender is systemd's connection count.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from hcsd.systemd.bus import (
    MANAGER,
    MANAGER_PATH,
    PROPERTIES,
    SERVICE,
    SYSTEMD,
    SystemdError,
    SystemdSender,
    SystemdUnavailable,
    UnitState,
    add_match,
    call,
    connect,
    load_unit,
    properties_changed,
    properties_changed_rule,
    unit_state,
)
from hcsd.systemd.timeouts import restart_wait

__all__ = [
    "DENIED",
    "NotRunning",
    "RestartFailed",
    "RestartPending",
    "RestartUnknown",
    "RestartWait",
    "main_started",
    "restart_unit",
]

# The errors of a call polkit (or the bus policy) did not allow: not root, nobody to ask.
DENIED = (
    "org.freedesktop.DBus.Error.AccessDenied",
    "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired",
)

NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"
STOPPED = ("inactive", "failed")
JOB_REMOVED_RULE = (
    f"type='signal',sender='{SYSTEMD}',path='{MANAGER_PATH}',"
    f"interface='{MANAGER}',member='JobRemoved'"
)


class RestartFailed(Exception):
    """The unit did not come back; the message says how it ended and what it is now."""


class NotRunning(Exception):
    """The unit was stopped (inactive or failed): TryRestartUnit left it so, as the operator
    had it; its new configuration applies when it next starts."""


class RestartPending(Exception):
    """The wait is over and systemd is still running the restart job (a slow start)."""


class RestartUnknown(Exception):
    """systemd queued the restart, but how it ends is not known here: the bus went away, or
    systemd stopped answering, while it ran."""


@dataclass
class RestartWait:
    """What is known of one restart: its job's end, the unit's latest state; whether it is over.

    Before the job ends nothing decides: a unit's state read just after RestartUnit may still
    be the old one (active, or failed from an earlier run)."""

    unit: str
    job: str
    job_result: str | None = None
    state: UnitState | None = None

    def job_removed(self, job: str, result: str) -> None:
        if job == self.job:
            self.job_result = result

    def saw(self, state: UnitState) -> None:
        self.state = state

    def saw_change(self, change: UnitState) -> None:
        """A PropertiesChanged of the Unit interface: Result (Service's) is kept."""
        self.state = UnitState(change.active, change.sub, self.state.result if self.state else "")

    def back(self) -> bool:
        """The job is done and the unit active."""
        active = self.state is not None and self.state.active == "active"
        return self.job_result == "done" and active

    def failure(self) -> str | None:
        """Why the restart failed, once that is certain; None while it may still succeed."""
        if self.job_result is None:
            return None
        state = f"; it is {self.state.describe()}" if self.state else ""
        if self.job_result != "done":
            return f"{self.unit}: the restart job ended '{self.job_result}'{state}"
        if self.state is not None and self.state.active in ("failed", "inactive"):
            return f"{self.unit}: restarted, then stopped{state}"
        return None


async def restart_unit(
    unit: str, timeout: float | None = None, *, address: str | None = None
) -> float:
    """Restart `unit` and wait until it is active: the seconds that took. SystemdUnavailable
    where there is no systemd to ask, SystemdError where it fails a call before the restart;
    RestartFailed when the restart is refused or the unit does not come back; RestartUnknown
    when the restart was queued and then the bus or systemd failed; RestartPending when the
    wait ends with systemd still running the job. The wait is `timeout` seconds where given,
    else as long as the unit's own stop and start timeouts allow (hcsd.systemd.timeouts)."""
    bus = await connect(address)
    events: asyncio.Queue[Message | None] = asyncio.Queue()  # None: the bus went away
    systemd = SystemdSender()

    def route(message: Message) -> None:
        systemd.saw(message)
        # Only systemd's own: another client may send a JobRemoved straight to us.
        if message.message_type == MessageType.SIGNAL and systemd.sent(message):
            events.put_nowait(message)

    bus.add_message_handler(route)
    closed = asyncio.create_task(_on_close(bus, events))
    started = time.monotonic()
    try:
        await systemd.start(bus)
        await call(bus, MANAGER_PATH, MANAGER, "Subscribe")
        await add_match(bus, JOB_REMOVED_RULE)
        # A unit the operator stopped stays stopped: try-restart, as `systemctl try-restart`.
        running = await _running(bus, unit)
        method = "RestartUnit" if running else "TryRestartUnit"
        try:
            (job,) = await call(bus, MANAGER_PATH, MANAGER, method, "ss", unit, "replace")
        except SystemdError as e:
            if e.name in DENIED:
                raise RestartFailed(
                    f"{unit}: not allowed to restart it ({e.text}); run as root (sudo)"
                ) from e
            raise RestartFailed(f"{unit}: systemd refused the restart: {e}") from e
        try:
            await _wait(bus, unit, job, timeout, events, try_only=not running)
        except (SystemdUnavailable, SystemdError) as e:
            raise RestartUnknown(
                f"{unit}: the restart was requested, but its outcome is unknown ({e})"
            ) from e
        return time.monotonic() - started
    finally:
        closed.cancel()
        bus.remove_message_handler(route)
        bus.disconnect()


async def main_started(unit: str, *, address: str | None = None) -> float | None:
    """When the unit's main process last started (the Service interface's
    ExecMainStartTimestamp, microseconds since the epoch), in seconds since the epoch: what it
    read its configuration after. None for a unit not loaded or never started."""
    bus = await connect(address)
    try:
        try:
            (path,) = await call(bus, MANAGER_PATH, MANAGER, "GetUnit", "s", unit)
        except SystemdError as e:
            if e.name == NO_SUCH_UNIT:
                return None
            raise
        (value,) = await call(bus, path, PROPERTIES, "Get", "ss", SERVICE, "ExecMainStartTimestamp")
        return int(value.value) / 1e6 if value.value else None
    finally:
        bus.disconnect()


async def _running(bus: MessageBus, unit: str) -> bool:
    """Whether the unit is neither inactive nor failed (systemd unloads stopped units, so one
    not loaded is stopped)."""
    try:
        (path,) = await call(bus, MANAGER_PATH, MANAGER, "GetUnit", "s", unit)
    except SystemdError as e:
        if e.name == NO_SUCH_UNIT:
            return False
        raise
    return (await unit_state(bus, path)).active not in STOPPED


async def _on_close(bus: MessageBus, events: asyncio.Queue[Message | None]) -> None:
    """Wake the wait when the bus goes away, rather than let it sleep out its timeout."""
    with contextlib.suppress(Exception):
        await bus.wait_for_disconnect()  # type: ignore[no-untyped-call]
    events.put_nowait(None)


async def _wait(
    bus: MessageBus,
    unit: str,
    job: str,
    timeout: float | None,
    events: asyncio.Queue[Message | None],
    *,
    try_only: bool,
) -> None:
    path = await load_unit(bus, unit)
    await add_match(bus, properties_changed_rule(path))
    wait = RestartWait(unit, job)
    wait.saw(await unit_state(bus, path))
    deadline = await restart_wait(bus, path, timeout)
    try:
        async with asyncio.timeout(deadline):
            await _until_over(bus, path, wait, events)
    except TimeoutError:
        with contextlib.suppress(SystemdError):
            wait.saw(await unit_state(bus, path))
        state = wait.state.describe() if wait.state else "unknown"
        late = f"{unit}: not active {deadline:g} s after the restart; it is {state}"
        if wait.job_result is None:
            raise RestartPending(f"{late}; systemd is still working on it") from None
        raise RestartFailed(late) from None
    except RestartFailed:
        if try_only and wait.job_result == "done" and wait.state is not None:
            raise NotRunning(
                f"{unit} is not running ({wait.state.describe()}), so nothing was restarted; "
                "the configuration applies when it next starts"
            ) from None
        raise


async def _until_over(
    bus: MessageBus, path: str, wait: RestartWait, events: asyncio.Queue[Message | None]
) -> None:
    while not wait.back():
        message = await events.get()
        if message is None:
            raise SystemdUnavailable("the system D-Bus connection closed")
        if (
            message.member == "JobRemoved"
            and message.interface == MANAGER
            and message.signature == "uoss"
        ):
            _, job, _, result = message.body
            wait.job_removed(job, result)
            if wait.job_result is not None:
                wait.saw(await unit_state(bus, path))  # Result and SubState as of the end
        elif (changed := properties_changed(message)) is not None and changed[0] == path:
            wait.saw_change(changed[1])
        if (why := wait.failure()) is not None:
            wait.saw(await unit_state(bus, path))
            raise RestartFailed(wait.failure() or why)
