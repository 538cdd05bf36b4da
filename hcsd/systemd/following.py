"""Follow units' ActiveState over D-Bus; call back each time one starts or is active again.

hcsd uses it for the container runtime: when containerd restarts, the NRI plugin loses its
connection and retries on a growing backoff (0.5 s doubling to 10 s); the moment systemd says
the runtime's unit is `activating` (its socket comes up during the start) or `active` again,
the plugin retries at once and often instead of sleeping out its delay. Watching costs nothing
while nothing changes: systemd pushes PropertiesChanged signals (once a client has called
Subscribe()) and the bus routes only the watched units' to us.

Without a system bus or systemd (a container, a host without systemd), or on any other error,
the reason is logged once and the connection retried every `retry` seconds quietly; the plugin
keeps its backoff, which is all it had before. A bus that goes away (dbus restarted) is
reconnected the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from dbus_fast import Message

from hcsd.systemd.bus import (
    MANAGER,
    MANAGER_PATH,
    SystemdError,
    SystemdSender,
    SystemdUnavailable,
    add_match,
    call,
    connect,
    load_unit,
    properties_changed,
    properties_changed_rule,
    unit_path,
)

__all__ = ["ActiveEdges", "follow_units"]

log = logging.getLogger(__name__)
RETRY = 30.0


NEWS = ("activating", "active")


class ActiveEdges:
    """Which ActiveState changes are news: a unit becoming `activating` or `active` from any
    other state, or from unknown (the first signal after connecting). systemd repeats
    ActiveState in every PropertiesChanged of the Unit interface, so a state after itself is
    no news."""

    def __init__(self, units: Sequence[str], paths: Sequence[str] | None = None) -> None:
        """`paths`: the units' object paths as systemd resolved them (LoadUnit), else the
        paths their names escape to."""
        self.names = dict(zip(paths or [unit_path(u) for u in units], units, strict=True))
        self.last: dict[str, str] = {}

    def saw(self, path: str, active: str) -> str | None:
        """The unit's name when this ActiveState is news, else None."""
        unit = self.names.get(path)
        if unit is None:
            return None
        before, self.last[path] = self.last.get(path), active
        return unit if active in NEWS and before != active else None


async def follow_units(
    units: Sequence[str],
    on_change: Callable[[str, str], None],
    *,
    address: str | None = None,
    retry: float = RETRY,
    connected: Callable[[], None] | None = None,
) -> None:
    """Call `on_change(unit, state)` each time one of `units` becomes `activating` or `active`;
    runs until cancelled.
    `connected` is called each time the watch is in place (tests wait for it)."""
    said: str | None = None

    def ready() -> None:
        nonlocal said
        said = None  # the next failure is news again
        if connected is not None:
            connected()

    while True:
        error: Exception | None = None
        try:
            await _follow(units, on_change, address, ready)
            why = kind = "the system D-Bus connection closed"
        except (SystemdUnavailable, SystemdError) as e:
            why = kind = str(e)
        except Exception as e:  # never hcsd's end: following only speeds up the plugin's retry
            why, kind, error = f"{type(e).__name__}: {e}", type(e).__name__, e
        if kind != said:
            log.log(
                logging.WARNING if error is not None else logging.INFO,
                "not following %s over D-Bus (%s); after a runtime restart the NRI plugin "
                "reconnects on its backoff; retrying every %g s",
                ", ".join(units),
                why,
                retry,
                exc_info=error,
            )
            said = kind
        await asyncio.sleep(retry)


async def _follow(
    units: Sequence[str],
    on_change: Callable[[str, str], None],
    address: str | None,
    ready: Callable[[], None],
) -> None:
    bus = await connect(address)
    systemd = SystemdSender()

    def route(message: Message) -> None:
        systemd.saw(message)
        if not systemd.sent(message):  # a signal forged by another client, straight to us
            return
        change = properties_changed(message)
        if change is not None and (unit := edges.saw(change[0], change[1].active)):
            log.debug("%s is %s", unit, change[1].active)
            on_change(unit, change[1].active)

    bus.add_message_handler(route)
    edges = ActiveEdges(units)
    try:
        await systemd.start(bus)
        # An alias (docker-containerd.service) signals under its unit's path: resolve each.
        edges = ActiveEdges(units, [await load_unit(bus, unit) for unit in units])
        for path in edges.names:  # matches need no loaded unit: containerd may come later
            await add_match(bus, properties_changed_rule(path))
        await call(bus, MANAGER_PATH, MANAGER, "Subscribe")
        log.info("following %s over D-Bus", ", ".join(units))
        ready()
        with contextlib.suppress(OSError, EOFError):  # the bus went away: say so, reconnect
            await bus.wait_for_disconnect()  # type: ignore[no-untyped-call]
    finally:
        bus.remove_message_handler(route)
        bus.disconnect()
