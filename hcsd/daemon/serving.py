"""A TCP server that never holds more than a fixed number of connections.

For ports any local user can reach (the metrics endpoint): each open connection costs hcsd a
descriptor, and running out of descriptors would take the API and the ledger down with it. So
connections are accepted only while fewer than `max_connections` are open; the rest wait in the
kernel's accept queue (as long as the cap, so a flood there costs the kernel, not hcsd) and get
their turn when one closes. Every connection has one deadline, `idle_timeout`, for all of its
life: a request never sent or a response never read cannot hold a slot longer than that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable

from hcsd.tasks import supervise

__all__ = ["BoundedServer", "Handler"]

log = logging.getLogger(__name__)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
ACCEPT_RETRY = 1.0  # after a failed accept (EMFILE and the like): wait, rather than spin and log


class BoundedServer:
    def __init__(
        self,
        handler: Handler,
        host: str,
        port: int,
        *,
        name: str,
        max_connections: int,
        idle_timeout: float,
        limit: int = 65536,
    ) -> None:
        self.handler = handler
        self.host = host
        self.port = port
        self.name = name
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.limit = limit
        self.open_connections = 0
        self.most_connections = 0
        self.saturated = 0  # times a connection had to wait for a free slot
        self._slots = asyncio.Semaphore(max_connections)
        self._listeners: list[socket.socket] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Bind and listen on every address `host` names; raises OSError as binding does."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(
            self.host or None, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        try:
            for family, kind, proto, _, address in dict.fromkeys(infos):
                listener = socket.socket(family, kind, proto)
                self._listeners.append(listener)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                listener.bind(address)
                listener.listen(self.max_connections)
                listener.setblocking(False)
        except BaseException:
            await self.stop()
            raise
        self.port = self._listeners[0].getsockname()[1]
        for listener in self._listeners:
            self._keep(supervise(self._accept(listener), f"{self.name}-accept"))

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._slots.locked():
                self.saturated += 1
                log.warning(
                    "%s: %d connections open, the most allowed; new ones wait their turn",
                    self.name,
                    self.max_connections,
                )
            await self._slots.acquire()
            try:
                connection, _ = await loop.sock_accept(listener)
            except OSError as e:
                self._slots.release()
                log.warning("%s: accept failed: %s", self.name, e)
                await asyncio.sleep(ACCEPT_RETRY)
                continue
            except BaseException:
                self._slots.release()
                raise
            self.open_connections += 1
            self.most_connections = max(self.most_connections, self.open_connections)
            self._keep(supervise(self._serve(connection), f"{self.name}-connection"))

    async def _serve(self, connection: socket.socket) -> None:
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self.idle_timeout):
                reader, writer = await asyncio.open_connection(sock=connection, limit=self.limit)
                await self.handler(reader, writer)
        except (
            asyncio.LimitOverrunError,
            asyncio.IncompleteReadError,
            TimeoutError,
            ConnectionError,
        ):
            pass
        finally:
            if writer is not None:
                writer.transport.abort()  # closed now, whatever is left unsent
            with contextlib.suppress(OSError):
                connection.close()
            self.open_connections -= 1
            self._slots.release()
