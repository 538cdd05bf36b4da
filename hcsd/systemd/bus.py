"""The few calls and signals of systemd's D-Bus API that HCS uses, over one system bus connection.

Names and signatures are systemd's own (org.freedesktop.systemd1(5)): the Manager object at
/org/freedesktop/systemd1 (GetUnit, RestartUnit, Subscribe, the JobRemoved signal), and per
unit the Unit interface's ActiveState and SubState and the Service interface's Result, which
systemd announces with org.freedesktop.DBus.Properties.PropertiesChanged, but only while at
least one client has called Subscribe().

No system bus (a container, a host without systemd) and no systemd on it (the bus answers that
nobody owns org.freedesktop.systemd1) are `SystemdUnavailable`: the caller's fallback applies.
Any other error reply is a `SystemdError` carrying systemd's own error name and text.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus

__all__ = [
    "MANAGER",
    "MANAGER_PATH",
    "SERVICE",
    "SYSTEMD",
    "UNIT",
    "SystemdError",
    "SystemdSender",
    "SystemdUnavailable",
    "UnitState",
    "add_match",
    "call",
    "connect",
    "load_unit",
    "properties_changed",
    "properties_changed_rule",
    "unit_path",
    "unit_state",
]

SYSTEMD = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
UNIT = "org.freedesktop.systemd1.Unit"
SERVICE = "org.freedesktop.systemd1.Service"
PROPERTIES = "org.freedesktop.DBus.Properties"
UNIT_PATH_PREFIX = "/org/freedesktop/systemd1/unit/"
BUS = "org.freedesktop.DBus"
BUS_PATH = "/org/freedesktop/DBus"
NAME_OWNER_RULE = (
    f"type='signal',sender='{BUS}',path='{BUS_PATH}',interface='{BUS}',"
    f"member='NameOwnerChanged',arg0='{SYSTEMD}'"
)
CONNECT_TIMEOUT = 5.0
CALL_TIMEOUT = 25.0  # the D-Bus reference implementation's default method call timeout
# The bus itself answers these when nobody owns the name we call: no systemd on this bus.
_NOBODY = ("org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner")


class SystemdUnavailable(Exception):
    """No system bus, or no systemd on it: nothing here can manage units through systemd."""


class SystemdError(Exception):
    """systemd refused or failed a call; `name` is its D-Bus error name."""

    def __init__(self, name: str, text: str) -> None:
        super().__init__(f"{text} ({name})")
        self.name = name
        self.text = text


@dataclass(frozen=True, slots=True)
class UnitState:
    """What systemd says about a unit: ActiveState, SubState and (services) Result."""

    active: str
    sub: str = ""
    result: str = ""

    def describe(self) -> str:
        """`failed (failed), result exit-code`: the words `systemctl status` shows."""
        text = f"{self.active} ({self.sub})" if self.sub else self.active
        return f"{text}, result {self.result}" if self.result else text


def unit_path(name: str) -> str:
    """The object path systemd gives the unit `name`: its bus label escaping replaces every
    character other than an ASCII letter or (past the first) a digit with `_` and two hex
    digits, so `containerd.service` is `/org/freedesktop/systemd1/unit/containerd_2eservice`."""
    if not name:
        return UNIT_PATH_PREFIX + "_"
    label = "".join(
        c if (c.isascii() and (c.isalpha() or (c.isdigit() and i > 0))) else f"_{ord(c):02x}"
        for i, c in enumerate(name)
    )
    return UNIT_PATH_PREFIX + label


async def connect(address: str | None = None) -> MessageBus:
    """The system bus ($DBUS_SYSTEM_BUS_ADDRESS, else /run/dbus/system_bus_socket).

    The constructor parses the address (a bad $DBUS_SYSTEM_BUS_ADDRESS raises there), so it is
    inside the try: every way of not getting a bus is SystemdUnavailable."""
    try:
        bus = MessageBus(bus_address=address) if address else MessageBus(bus_type=BusType.SYSTEM)
        async with asyncio.timeout(CONNECT_TIMEOUT):
            await bus.connect()
    except (OSError, TimeoutError, EOFError) as e:
        raise SystemdUnavailable(f"no system D-Bus: {_reason(e)}") from e
    except Exception as e:  # dbus-fast's authentication and address errors
        raise SystemdUnavailable(f"cannot use the system D-Bus: {_reason(e)}") from e
    return bus


async def call(
    bus: MessageBus,
    path: str,
    interface: str,
    member: str,
    signature: str = "",
    *args: Any,
    destination: str = SYSTEMD,
) -> list[Any]:
    """One method call; the reply's body, or SystemdUnavailable / SystemdError."""
    message = Message(
        destination=destination,
        path=path,
        interface=interface,
        member=member,
        signature=signature,
        body=list(args),
    )
    try:
        async with asyncio.timeout(CALL_TIMEOUT):
            reply = await bus.call(message)
    except (OSError, EOFError) as e:
        raise SystemdUnavailable(f"the system D-Bus went away: {_reason(e)}") from e
    except TimeoutError as e:
        raise SystemdError("timeout", f"{member}: no answer in {CALL_TIMEOUT:.0f} s") from e
    if reply.message_type == MessageType.ERROR:
        name = reply.error_name or "unknown"
        text = str(reply.body[0]) if reply.body else name
        if name in _NOBODY:
            raise SystemdUnavailable(f"no systemd on the system D-Bus: {text}")
        raise SystemdError(name, text)
    return list(reply.body)


async def load_unit(bus: MessageBus, name: str) -> str:
    """The object path of the unit `name` as systemd resolves it (LoadUnit): an alias's is its
    unit's, which unit_path(alias) is not; a unit not installed yet gets its own name's."""
    (path,) = await call(bus, MANAGER_PATH, MANAGER, "LoadUnit", "s", name)
    return str(path)


async def add_match(bus: MessageBus, rule: str) -> None:
    """Ask the bus to route the signals `rule` matches to this connection."""
    await call(
        bus,
        "/org/freedesktop/DBus",
        "org.freedesktop.DBus",
        "AddMatch",
        "s",
        rule,
        destination="org.freedesktop.DBus",
    )


def properties_changed_rule(path: str) -> str:
    """The match rule for the Unit interface's PropertiesChanged signals of one unit."""
    return (
        f"type='signal',sender='{SYSTEMD}',path='{path}',"
        f"interface='{PROPERTIES}',member='PropertiesChanged',arg0='{UNIT}'"
    )


def properties_changed(message: Message) -> tuple[str, UnitState] | None:
    """(unit path, its new ActiveState and SubState) from a PropertiesChanged signal of a Unit
    interface that carries ActiveState (systemd sends both together); None for any other."""
    if (
        message.message_type != MessageType.SIGNAL
        or message.interface != PROPERTIES
        or message.member != "PropertiesChanged"
        or message.signature != "sa{sv}as"
        or not message.path
        or not message.path.startswith(UNIT_PATH_PREFIX)
        or message.body[0] != UNIT
    ):
        return None
    changed = message.body[1]
    active = changed.get("ActiveState") if isinstance(changed, dict) else None
    if active is None or not isinstance(active.value, str):
        return None
    sub = changed.get("SubState")
    return message.path, UnitState(active.value, sub.value if sub is not None else "")


class SystemdSender:
    """Which connection is systemd: only its signals count.

    Match rules only choose what the bus broadcasts to us; any local client may send a signal
    straight to our unique name (the usual system bus policy allows it), with systemd's path,
    interface and member. So each signal's sender is compared with the unique name that owns
    org.freedesktop.systemd1, asked for once connected and kept current through the bus's
    NameOwnerChanged (systemd's daemon-reexec gives it a new one)."""

    def __init__(self) -> None:
        self.owner: str | None = None

    async def start(self, bus: MessageBus) -> None:
        """Follow the owner; call with `self.saw` already a message handler of `bus`."""
        await add_match(bus, NAME_OWNER_RULE)
        # Nobody owning the name is NameHasNoOwner: SystemdUnavailable, as for any call.
        (owner,) = await call(bus, BUS_PATH, BUS, "GetNameOwner", "s", SYSTEMD, destination=BUS)
        if self.owner is None:  # a NameOwnerChanged meanwhile is newer than this answer
            self.owner = str(owner)

    def saw(self, message: Message) -> None:
        """A message handler: NameOwnerChanged of org.freedesktop.systemd1 from the bus."""
        if (
            message.message_type == MessageType.SIGNAL
            and message.sender == BUS
            and message.member == "NameOwnerChanged"
            and message.signature == "sss"
            and message.body[0] == SYSTEMD
        ):
            self.owner = str(message.body[2]) or None

    def sent(self, message: Message) -> bool:
        """Whether systemd itself sent this message."""
        return self.owner is not None and message.sender == self.owner


async def unit_state(bus: MessageBus, path: str) -> UnitState:
    """ActiveState and SubState of the unit at `path`, and its Result when it is a service."""
    values = (await call(bus, path, PROPERTIES, "GetAll", "s", UNIT))[0]
    result = ""
    with contextlib.suppress(SystemdError):  # not a service: no Result
        result = (await call(bus, path, PROPERTIES, "Get", "ss", SERVICE, "Result"))[0].value
    return UnitState(str(values["ActiveState"].value), str(values["SubState"].value), str(result))


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        where = f" ({error.filename})" if error.filename else ""
        return f"{error.strerror}{where}"
    return str(error) or type(error).__name__
