"""A stand-in for systemd on a private dbus-daemon: what HCS's client uses of
org.freedesktop.systemd1(5), with systemd's names, signatures and behaviour.

systemd cannot run as PID 1 here, so the tests export this at org.freedesktop.systemd1: the
Manager (GetUnit, RestartUnit, Subscribe, Unsubscribe, the JobRemoved signal) and per unit the
Unit interface (Id, LoadState, ActiveState, SubState, Job) and the Service interface (Result,
ExecMainStartTimestamp, TimeoutStartUSec, TimeoutStopUSec),
at the object path systemd's bus label escaping gives. As in systemd: GetUnit fails with
org.freedesktop.systemd1.NoSuchUnit for a unit not loaded; RestartUnit only queues a job and
answers its path, and the job runs afterwards (stop, then start) with PropertiesChanged at each
state and JobRemoved(id, job, unit, result) at its end; signals go out only while a client has
called Subscribe() (tracked by count here, where systemd also drops clients that disconnect).
"""

import asyncio
import time
from dataclasses import dataclass, field
from typing import Annotated

from dbus_fast import DBusError
from dbus_fast.annotations import (
    DBusObjectPath,
    DBusSignature,
    DBusStr,
    DBusUInt32,
    DBusUInt64,
)
from dbus_fast.service import (
    PropertyAccess,
    ServiceInterface,
    dbus_method,
    dbus_property,
    dbus_signal,
)

from hcsd.systemd.bus import unit_path

JobRef = Annotated[tuple[int, str], DBusSignature("(uo)")]
NO_JOB = (0, "/")


@dataclass
class Outcome:
    """How the next restart of a unit goes: the states its start passes through, the job's
    result, the service's Result; `hang` leaves it activating forever (a start that never
    finishes)."""

    start: list[tuple[str, str]] = field(
        default_factory=lambda: [("activating", "start"), ("active", "running")]
    )
    job_result: str = "done"
    result: str = "success"
    hang: bool = False


def now_us() -> int:
    """systemd's timestamps: microseconds since the epoch (CLOCK_REALTIME)."""
    return time.time_ns() // 1000


USEC_INFINITY = 2**64 - 1


class Service(ServiceInterface):
    """org.freedesktop.systemd1.Service: Result, ExecMainStartTimestamp (t, microseconds
    since the epoch; 0 before the first start), TimeoutStartUSec and TimeoutStopUSec (t,
    microseconds, systemd's default 90 s; USEC_INFINITY for none)."""

    def __init__(self) -> None:
        super().__init__("org.freedesktop.systemd1.Service")
        self.result = "success"
        self.main_started = now_us()
        self.timeout_start = self.timeout_stop = 90_000_000

    @dbus_property(access=PropertyAccess.READ, name="TimeoutStartUSec")
    def TimeoutStartUSec(self) -> DBusUInt64:
        return self.timeout_start

    @dbus_property(access=PropertyAccess.READ, name="TimeoutStopUSec")
    def TimeoutStopUSec(self) -> DBusUInt64:
        return self.timeout_stop

    @dbus_property(access=PropertyAccess.READ, name="Result")
    def Result(self) -> DBusStr:
        return self.result

    @dbus_property(access=PropertyAccess.READ, name="ExecMainStartTimestamp")
    def ExecMainStartTimestamp(self) -> DBusUInt64:
        return self.main_started


class Unit(ServiceInterface):
    """org.freedesktop.systemd1.Unit of one loaded service."""

    def __init__(self, name: str, manager: "Manager") -> None:
        super().__init__("org.freedesktop.systemd1.Unit")
        self.id = name
        self.manager = manager
        self.active, self.sub = "active", "running"
        self.job: tuple[int, str] = NO_JOB
        self.service = Service()
        self.next = Outcome()

    @dbus_property(access=PropertyAccess.READ, name="Id")
    def Id(self) -> DBusStr:
        return self.id

    @dbus_property(access=PropertyAccess.READ, name="LoadState")
    def LoadState(self) -> DBusStr:
        return "loaded"

    @dbus_property(access=PropertyAccess.READ, name="ActiveState")
    def ActiveState(self) -> DBusStr:
        return self.active

    @dbus_property(access=PropertyAccess.READ, name="SubState")
    def SubState(self) -> DBusStr:
        return self.sub

    @dbus_property(access=PropertyAccess.READ, name="Job")
    def Job(self) -> JobRef:
        return self.job

    def set(self, active: str, sub: str) -> None:
        """A state change, announced as systemd does: the Unit interface's changing properties
        together in one PropertiesChanged."""
        self.active, self.sub = active, sub
        if self.manager.subscribers:
            self.emit_properties_changed(
                {"ActiveState": active, "SubState": sub, "Job": list(self.job)}
            )

    def set_result(self, result: str) -> None:
        self.service.result = result
        if self.manager.subscribers:
            self.service.emit_properties_changed({"Result": result})

    async def run_restart(self, job_id: int, job: str, step: float) -> None:
        """The restart job: stop, then start as `next` says, then JobRemoved."""
        outcome = self.next
        await asyncio.sleep(step)  # systemd answers RestartUnit before the job runs
        for active, sub in (("deactivating", "stop-sigterm"), ("inactive", "dead")):
            self.set(active, sub)
            await asyncio.sleep(step)
        self.service.main_started = now_us()  # the start's ExecStart=
        for active, sub in outcome.start:
            self.set(active, sub)
            await asyncio.sleep(step)
        if outcome.hang:
            return
        if outcome.result != self.service.result:
            self.set_result(outcome.result)
        self.job = NO_JOB
        self.set(self.active, self.sub)
        self.manager.job_removed(job_id, job, self.id, outcome.job_result)


class Manager(ServiceInterface):
    """org.freedesktop.systemd1.Manager at /org/freedesktop/systemd1."""

    def __init__(self, step: float = 0.05) -> None:
        super().__init__("org.freedesktop.systemd1.Manager")
        self.units: dict[str, Unit] = {}
        self.subscribers = 0
        self.step = step
        self.last_job = 0
        self.restarts: list[str] = []
        self.aliases: dict[str, str] = {}  # Alias= of the units' [Install] sections
        # method -> the D-Bus error it answers, as polkit's refusal of a non-root caller does
        self.refuse: dict[str, str] = {}
        self.jobs: set[asyncio.Task[None]] = set()

    def load(self, name: str) -> Unit:
        unit = Unit(name, self)
        self.units[name] = unit
        return unit

    @dbus_method(name="LoadUnit")
    def LoadUnit(self, name: DBusStr) -> DBusObjectPath:
        """As systemd: an alias resolves to its unit; a name of no unit file still gets a path
        (systemd loads a stub with LoadState not-found)."""
        return unit_path(self.aliases.get(name, name))

    @dbus_method(name="GetUnit")
    def GetUnit(self, name: DBusStr) -> DBusObjectPath:
        if name not in self.units:
            raise DBusError("org.freedesktop.systemd1.NoSuchUnit", f"Unit {name} not loaded.")
        return unit_path(name)

    @dbus_method(name="RestartUnit")
    def RestartUnit(self, name: DBusStr, mode: DBusStr) -> DBusObjectPath:
        self.refused("RestartUnit")
        return self.queue_restart(name, mode)

    def queue_restart(self, name: str, mode: str) -> str:
        unit = self.units.get(name)
        if unit is None:
            raise DBusError("org.freedesktop.systemd1.NoSuchUnit", f"Unit {name} not found.")
        if mode not in ("replace", "fail", "isolate", "ignore-dependencies", "ignore-requirements"):
            raise DBusError("org.freedesktop.DBus.Error.InvalidArgs", f"Job mode {mode} invalid.")
        self.last_job += 1
        job = f"/org/freedesktop/systemd1/job/{self.last_job}"
        unit.job = (self.last_job, job)
        self.restarts.append(name)
        task = asyncio.get_running_loop().create_task(
            unit.run_restart(self.last_job, job, self.step)
        )
        self.jobs.add(task)
        task.add_done_callback(self.jobs.discard)
        return job

    @dbus_method(name="TryRestartUnit")
    def TryRestartUnit(self, name: DBusStr, mode: DBusStr) -> DBusObjectPath:
        """As systemd: a stopped (inactive or failed) unit gets a no-op job, removed 'done'
        with the unit left as it was; a running one is restarted."""
        self.refused("TryRestartUnit")
        unit = self.units.get(name)
        if unit is None or unit.active not in ("inactive", "failed"):
            return self.queue_restart(name, mode)
        self.last_job += 1
        job_id, job = self.last_job, f"/org/freedesktop/systemd1/job/{self.last_job}"

        async def nop() -> None:
            await asyncio.sleep(self.step)
            self.job_removed(job_id, job, name, "done")

        task = asyncio.get_running_loop().create_task(nop())
        self.jobs.add(task)
        task.add_done_callback(self.jobs.discard)
        return job

    def restart_outside(self, name: str) -> None:
        """`systemctl restart NAME` by someone else (the operator): the same job."""
        unit = self.units[name]
        self.last_job += 1
        job = f"/org/freedesktop/systemd1/job/{self.last_job}"
        unit.job = (self.last_job, job)
        task = asyncio.get_running_loop().create_task(
            unit.run_restart(self.last_job, job, self.step)
        )
        self.jobs.add(task)
        task.add_done_callback(self.jobs.discard)

    def refused(self, method: str) -> None:
        if method in self.refuse:
            raise DBusError(self.refuse[method], f"{method} refused (test)")

    @dbus_method(name="Subscribe")
    def Subscribe(self) -> None:
        self.refused("Subscribe")
        self.subscribers += 1

    @dbus_method(name="Unsubscribe")
    def Unsubscribe(self) -> None:
        self.subscribers = max(0, self.subscribers - 1)

    @dbus_signal(name="JobRemoved")
    def JobRemoved(
        self, job_id: DBusUInt32, job: DBusObjectPath, unit: DBusStr, result: DBusStr
    ) -> Annotated[tuple[int, str, str, str], DBusSignature("uoss")]:
        return job_id, job, unit, result

    def job_removed(self, job_id: int, job: str, unit: str, result: str) -> None:
        if self.subscribers:
            self.JobRemoved(job_id, job, unit, result)
