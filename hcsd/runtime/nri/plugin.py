"""hcsd as an NRI plugin: register with the runtime, then answer its lifecycle events.

One session per runtime connection: the mux carries our ttrpc server (conn 1, the Plugin
service) and our client of the runtime (conn 2). RegisterPlugin is sent at once; Configure may
arrive before its reply, which is why the server runs from the start. The subscribed events
follow the handlers defined below; Synchronize reconciles the ledger with the containers that
really exist (each session collects its own `more` chunks). When the runtime goes away (EOF),
the plugin reconnects with backoff; `runtime_changed()` (called when systemd says the runtime's
unit is starting or active again, hcsd/systemd/following.py) cuts the wait short and retries
every FAST_RETRY seconds for a while, so the plugin registers as soon as the socket listens.

The runtime waits `plugin_request_timeout` (2 s by default) for each answer, then drops the
plugin and creates the container without it. CreateContainer does one fsync'd ledger append
and writes the container's quota file and usage region (plus, every `ledger.compact_after`
records, a snapshot), so it takes milliseconds; one that took over SLOW_REQUEST seconds is
logged as a warning with the container, because the next one may miss the runtime's deadline.

A refusal from any handler becomes the ttrpc status of hcsd/refusals.py's table, with the
reason (and whether a retry may succeed) in the text, which is all the runtime passes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from hcsd.model import FrontEnd
from hcsd.refusals import Refusal
from hcsd.runtime.injector import Injector
from hcsd.runtime.nri.adjust import adjustment, container_info, running_container
from hcsd.runtime.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Mux, MuxError
from hcsd.runtime.nri.ttrpc import Client, Code, Server, TtrpcError
from hcsd.runtime.nri.v1alpha1 import api_pb2 as api
from hcsd.runtime.nri.versions import argv_adjustable, at_least
from hcsd.runtime.settings import RuntimeSection
from hcsd.telemetry import Telemetry

__all__ = ["PLUGIN_SERVICE", "RUNTIME_SERVICE", "NriPlugin"]

log = logging.getLogger(__name__)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
# Runtimes with NRI up to v0.9 drop a plugin that subscribes to an event they do not know.
OLD_RUNTIME_EVENTS = 0x7FF
REGISTER_TIMEOUT = 5.0
# Half the runtimes' default request timeout (2 s): slower than this is one stall from failing.
SLOW_REQUEST = 1.0
DEFAULT_REQUEST_TIMEOUT_MS = 2000  # containerd's plugin_request_timeout
# While the runtime's unit is starting (or just became active), retry this often: its NRI socket
# listens some time into the start (before containerd's READY=1, seen under systemd 252).
FAST_RETRY = 0.1
FAST_FOR = 30.0  # at most this long after the news: a start that hangs is not polled forever


@dataclass
class _Session:
    """What one runtime connection accumulates: its Synchronize chunks, its settings."""

    sync_pods: list[api.PodSandbox] = field(default_factory=list)
    sync_containers: list[api.Container] = field(default_factory=list)
    request_timeout_ms: int = 0
    runtime: str = ""  # name and version, as Configure gave them
    argv_adjustable: bool = False  # whether it applies ContainerAdjustment.args (versions.py)


class NriPlugin:
    def __init__(
        self,
        injector: Injector,
        settings: RuntimeSection | None = None,
        *,
        name: str = "hcsd",
        backoff: tuple[float, float] = (0.5, 10.0),
        clock: Callable[[], float] = time.perf_counter,
        telemetry: Telemetry | None = None,
    ) -> None:
        settings = settings or RuntimeSection()
        self.telemetry = telemetry
        if telemetry is not None and telemetry.nri_sessions is None:
            telemetry.nri_sessions = 0
        self.injector = injector
        self.socket_path = settings.nri_socket
        self.prelaunch_socket = settings.nri_prelaunch_socket
        self.name = name
        self.index = settings.plugin_index  # two digits: checked by the section
        self.backoff = backoff
        self.clock = clock
        self.runtime = ""
        self.connected = asyncio.Event()
        self._runtime_back = asyncio.Event()  # set by runtime_changed(): stop waiting, connect
        self._fast_until = 0.0  # time.monotonic() until which to retry every FAST_RETRY
        self.create_seconds: list[float] = []  # in-plugin CreateContainer handling times
        # Event → handler: the subscription mask is derived from this table.
        self.events: dict[int, str] = {
            api.RUN_POD_SANDBOX: "StateChange",  # when the first container's age is taken
            api.REMOVE_POD_SANDBOX: "StateChange",
            api.CREATE_CONTAINER: "CreateContainer",
            api.STOP_CONTAINER: "StopContainer",
            api.REMOVE_CONTAINER: "RemoveContainer",
        }

    # -- connection life cycle --------------------------------------------------------------

    def runtime_changed(self, unit: str, state: str) -> None:
        """The runtime's unit is `activating` or `active` again: connect now and retry every
        FAST_RETRY s for a while, not at the end of the backoff."""
        if self.connected.is_set():
            return
        news = "starting" if state == "activating" else "active again"
        log.info("nri: %s is %s; connecting as soon as it listens", unit, news)
        self._fast_until = time.monotonic() + FAST_FOR
        self._runtime_back.set()

    async def _pause(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True when runtime_changed() cut it short."""
        try:
            async with asyncio.timeout(seconds):
                await self._runtime_back.wait()
        except TimeoutError:
            return False
        self._runtime_back.clear()
        return True

    async def run(self) -> None:
        """Connect, serve, and reconnect with backoff whenever the runtime goes away."""
        delay = self.backoff[0]
        waiting_logged = False
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(self.socket_path)
            except OSError as e:
                if not waiting_logged:
                    log.warning(
                        "nri: cannot connect to %s (%s); retrying",
                        self.socket_path,
                        e.strerror or e,
                    )
                    waiting_logged = True
                await self._pause(delay)
                fast = time.monotonic() < self._fast_until
                delay = FAST_RETRY if fast else min(delay * 2, self.backoff[1])
                continue
            waiting_logged = False
            delay = self.backoff[0]
            self._runtime_back.clear()  # news of an earlier start: this connection is newer
            self._fast_until = 0.0
            try:
                await self.session(reader, writer)
            except (MuxError, TtrpcError, ConnectionError) as e:
                log.warning("nri: session with the runtime ended: %s", e)
            finally:
                self.connected.clear()
                writer.close()
            log.info("nri: runtime connection closed; reconnecting")
            await self._pause(self.backoff[0])

    async def serve_prelaunched(self) -> None:
        """Accept connections relayed by `hcs-nri-plugin` (the runtime's pre-launched form)."""
        socket_path = self.prelaunch_socket
        directory = os.path.dirname(socket_path) or "."
        os.makedirs(directory, mode=0o755, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # The umask is process-wide: set it around the bind alone, with no await in between,
        # or every file other tasks create meanwhile (quota directories) gets mode 0600.
        old_umask = os.umask(0o177)
        try:
            listener.bind(socket_path)
        except OSError:
            listener.close()
            raise
        finally:
            os.umask(old_umask)
        server = await asyncio.start_unix_server(self._prelaunched, sock=listener)
        log.info("nri: accepting pre-launched plugin connections on %s", socket_path)
        async with server:
            await server.serve_forever()

    async def _prelaunched(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        log.info("nri: the runtime started hcsd's pre-launched plugin")
        try:
            await self.session(reader, writer)
        except (MuxError, TtrpcError, ConnectionError) as e:
            log.warning("nri: pre-launched session ended: %s", e)
        finally:
            writer.close()

    async def session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one runtime connection until it closes."""
        mux = Mux(reader, writer)
        plugin_side = mux.open(PLUGIN_SERVICE_CONN)
        runtime_side = mux.open(RUNTIME_SERVICE_CONN)
        server = Server(
            self._handlers(_Session()), lambda data: mux.send(PLUGIN_SERVICE_CONN, data)
        )
        client = Client(lambda data: mux.send(RUNTIME_SERVICE_CONN, data))
        registered = False
        reading = asyncio.create_task(mux.run(), name="nri-mux")
        serving = asyncio.create_task(server.serve(plugin_side), name="nri-server")
        receiving = asyncio.create_task(client.receive(runtime_side), name="nri-client")
        try:
            request = api.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
            await client.call(
                RUNTIME_SERVICE,
                "RegisterPlugin",
                request.SerializeToString(),
                timeout=REGISTER_TIMEOUT,
            )
            log.info(
                "nri: registered as %s-%s with %s",
                self.index,
                self.name,
                self.runtime or "the runtime",
            )
            self.connected.set()
            registered = True
            self._registered(+1)
            await reading
        finally:
            if registered:
                self._registered(-1)
            for task in (reading, serving, receiving):
                task.cancel()
            await asyncio.gather(reading, serving, receiving, return_exceptions=True)

    def _registered(self, change: int) -> None:
        """Count this session in or out of the registered ones (hcs_nri_registered)."""
        if self.telemetry is not None and self.telemetry.nri_sessions is not None:
            self.telemetry.nri_sessions += change

    # -- handlers ---------------------------------------------------------------------------

    def _handlers(
        self, session: _Session
    ) -> dict[tuple[str, str], Callable[[bytes], Awaitable[bytes]]]:
        async def configure(payload: bytes) -> bytes:
            return await self._configure(session, payload)

        async def synchronize(payload: bytes) -> bytes:
            return await self._synchronize(session, payload)

        async def create_container(payload: bytes) -> bytes:
            return await self._create_container(session, payload)

        table: dict[str, Callable[[bytes], Awaitable[bytes]]] = {
            "Configure": configure,
            "Synchronize": synchronize,
            "Shutdown": self._shutdown,
            "CreateContainer": create_container,
            "StopContainer": self._stop_container,
            "RemoveContainer": self._remove_container,
            "StateChange": self._state_change,
            "UpdateContainer": self._update_container,
        }
        return {
            (PLUGIN_SERVICE, method): _timed(method, _refusals_as_status(handler), self.telemetry)
            for method, handler in table.items()
        }

    def event_mask(self, nri_version: str) -> int:
        mask = 0
        for event in self.events:
            mask |= 1 << (event - 1)
        if not at_least(nri_version, (0, 10)) and mask & ~OLD_RUNTIME_EVENTS:
            mask &= OLD_RUNTIME_EVENTS
        return mask

    async def _configure(self, session: _Session, payload: bytes) -> bytes:
        request = api.ConfigureRequest.FromString(payload)
        session.request_timeout_ms = request.request_timeout
        self.runtime = f"{request.runtime_name} {request.runtime_version}".strip()
        session.runtime = self.runtime
        session.argv_adjustable = argv_adjustable(
            request.NRI_version, request.runtime_name, request.runtime_version
        )
        mask = self.event_mask(request.NRI_version)
        log.info(
            "nri: configured by %s (NRI %s, request timeout %d ms); events %#x; runtime "
            "profiles that replace the command: %s",
            self.runtime,
            request.NRI_version or "unknown",
            request.request_timeout,
            mask,
            "applied" if session.argv_adjustable else "refused (no NRI args adjustment)",
        )
        return api.ConfigureResponse(events=mask).SerializeToString()

    async def _synchronize(self, session: _Session, payload: bytes) -> bytes:
        request = api.SynchronizeRequest.FromString(payload)
        session.sync_pods.extend(request.pods)
        session.sync_containers.extend(request.containers)
        if request.more:
            return api.SynchronizeResponse(more=True).SerializeToString()
        pods = {p.id: p for p in session.sync_pods}
        containers = session.sync_containers
        session.sync_pods, session.sync_containers = [], []
        running = [
            running_container(pods.get(c.pod_sandbox_id, api.PodSandbox()), c)
            for c in containers
            if c.state != api.CONTAINER_STOPPED
        ]
        self.injector.reconcile(running, FrontEnd.NRI)
        log.info("nri: synchronized with %d container(s)", len(containers))
        return api.SynchronizeResponse().SerializeToString()

    async def _shutdown(self, payload: bytes) -> bytes:
        log.info("nri: the runtime is shutting the plugin down")
        return api.Empty().SerializeToString()

    async def _create_container(self, session: _Session, payload: bytes) -> bytes:
        started = self.clock()
        request = api.ContainerRequest.FromString(payload)
        info = container_info(
            request.pod, request.container, session.argv_adjustable, session.runtime
        )
        # The checkpoint scan first, awaited in its thread (the loop serves other requests
        # meanwhile), at most a quarter of the runtime's wait: the allocation needs the rest.
        timeout_ms = session.request_timeout_ms or DEFAULT_REQUEST_TIMEOUT_MS
        resume = await self.injector.resume(info, timeout=timeout_ms / 4000)
        scanned = self.clock() - started
        edits = self.injector.create(info, resume)
        response = api.CreateContainerResponse()
        if edits is not None:
            response.adjust.CopyFrom(adjustment(edits, request.container.env))
        elapsed = self.clock() - started
        self.create_seconds.append(elapsed)
        if len(self.create_seconds) > 10_000:
            del self.create_seconds[:5_000]
        if elapsed > SLOW_REQUEST:
            cause = (
                f"the checkpoint scan took {scanned:.2f} s of it (runtime.checkpoints.timeout)"
                if scanned > elapsed / 2
                else "check the ledger's disk (fsync) and hcsd's CPU"
            )
            log.warning(
                "%s: CreateContainer took %.2f s in hcsd (the runtime waits %d ms); a slower "
                "one would start the container without its devices and quota: %s",
                info.label,
                elapsed,
                timeout_ms,
                cause,
            )
        return response.SerializeToString()

    async def _stop_container(self, payload: bytes) -> bytes:
        request = api.ContainerRequest.FromString(payload)
        self.injector.stopped(request.container.id)
        return api.StopContainerResponse().SerializeToString()

    async def _remove_container(self, payload: bytes) -> bytes:
        request = api.ContainerRequest.FromString(payload)
        self.injector.removed(request.container.id)
        return api.Empty().SerializeToString()

    async def _update_container(self, payload: bytes) -> bytes:
        return api.UpdateContainerResponse().SerializeToString()

    async def _state_change(self, payload: bytes) -> bytes:
        """Pod sandbox events, and (runtimes before NRI v0.12) container stop and remove."""
        event = api.StateChangeEvent.FromString(payload)
        if event.event == api.RUN_POD_SANDBOX:
            self.injector.pod_started(event.pod.uid)
        elif event.event == api.REMOVE_POD_SANDBOX:
            self.injector.pod_removed(event.pod.uid)
        elif event.event == api.STOP_CONTAINER:
            self.injector.stopped(event.container.id)
        elif event.event == api.REMOVE_CONTAINER:
            self.injector.removed(event.container.id)
        return api.Empty().SerializeToString()


def _refusals_as_status(
    handler: Callable[[bytes], Awaitable[bytes]],
) -> Callable[[bytes], Awaitable[bytes]]:
    async def handle(payload: bytes) -> bytes:
        try:
            return await handler(payload)
        except Refusal as e:
            raise TtrpcError(Code(e.code.value), f"hcsd: {e.describe()}") from e

    return handle


def _timed(
    method: str, handler: Callable[[bytes], Awaitable[bytes]], telemetry: Telemetry | None
) -> Callable[[bytes], Awaitable[bytes]]:
    """The handler, its time observed in `hcs_nri_hook_duration_seconds{hook=method}`."""
    if telemetry is None:
        return handler
    telemetry.nri.labels(method)  # the series from the start: a rate sees its first call

    async def handle(payload: bytes) -> bytes:
        with telemetry.timed(telemetry.nri, method):
            return await handler(payload)

    return handle
