"""The gRPC servicer and its unix-socket server.

The socket is created with mode 0600 (umask set around the bind, then chmod to be sure): only
root may allocate devices or read who holds them. A stale socket from a crashed daemon is
replaced; a live one means another hcsd runs and we refuse to start.

A `Refusal` raised by any method becomes the status code of hcsd/refusals.py's table, with the
message as details and the reason in the trailing metadata (METADATA_KEY), so that clients
(hcsctl, the front ends) get the reason back without parsing text.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator

import grpc

from hcsd import __version__
from hcsd.api.claim_methods import ClaimMethods
from hcsd.api.dispatch import grpc_code, handlers
from hcsd.api.messages import (
    InvalidRequest,
    allocation_to_pb,
    device_to_pb,
    event_to_pb,
    outcome_to_pb,
    request_from_pb,
)
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.api.v1 import hcsd_pb2_grpc as pb_grpc
from hcsd.benchmarks import Measure
from hcsd.contract.keyring import decode as decode_keyring
from hcsd.contract.keyring_files import write_keyring
from hcsd.contract.keys import AssignmentKeyError
from hcsd.contract.names import container_id_problem
from hcsd.fs import remove_stale_socket
from hcsd.model import FrontEnd, PodRef
from hcsd.refusals import Reason, Refusal
from hcsd.runtime.container_files import ContainerUser
from hcsd.runtime.container_info import ContainerInfo
from hcsd.runtime.injector import Injector
from hcsd.runtime.presence import ContainerView
from hcsd.service import NodeService, WatchOverflow
from hcsd.telemetry import Telemetry

__all__ = ["ApiServer", "HcsdServicer", "SocketInUse", "grpc_code"]

log = logging.getLogger(__name__)

MAX_MESSAGE = 4 * 1024 * 1024
# The front ends that call PrepareContainer; anything else is recorded as unknown.
_CONTAINER_FRONT_ENDS = (FrontEnd.RUNC_WRAPPER, FrontEnd.OCI_HOOK)


class SocketInUse(Exception):
    """Another process is serving on the socket path."""


class HcsdServicer(ClaimMethods, pb_grpc.HcsdServicer):  # type: ignore[misc]
    def __init__(
        self, service: NodeService, injector: Injector | None = None, measure: Measure | None = None
    ) -> None:
        self.service = service
        self.injector = injector
        self.measure = measure
        ClaimMethods.__init__(self, service, injector)

    async def GetNode(self, request: pb.GetNodeRequest, context: object) -> pb.Node:
        s = self.service
        return pb.Node(
            name=s.node_name,
            version=s.version or __version__,
            backends=list(s.backends),
            discovery_notes=list(s.discovery_notes),
            ledger_seq=s.seq,
            device_count=len(s.devices()),
            allocation_count=len(s.allocations()),
            started_at=s.started_at,
            orphaned_containers=[a.container_id for a in s.orphans()],
            health_source=s.health_source,
            mode=self.injector.settings.mode.value if self.injector is not None else "",
            assignment_key_ids=self._key_ids(),
            fabric_domain=s.fabric.domain,
            fabric_source=s.fabric.source,
            fabric_ports=[p.describe() for p in s.fabric.ports],
            fabric_notes=list(s.fabric.notes),
        )

    def _key_ids(self) -> list[str]:
        if self.injector is None:
            return []
        try:
            return sorted(self.injector.acceptances.keys())
        except AssignmentKeyError:
            return []

    async def ListDevices(
        self, request: pb.ListDevicesRequest, context: object
    ) -> pb.ListDevicesResponse:
        return pb.ListDevicesResponse(devices=[device_to_pb(d) for d in self.service.devices()])

    async def ListAllocations(
        self, request: pb.ListAllocationsRequest, context: object
    ) -> pb.ListAllocationsResponse:
        return pb.ListAllocationsResponse(
            allocations=[allocation_to_pb(a) for a in self.service.allocations()]
        )

    async def Allocate(
        self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateResponse:
        self._check_container_id(request.container_id)
        try:
            parsed = request_from_pb(request)
        except InvalidRequest as e:
            raise self._invalid(request.container_id, f"invalid request: {e}") from e
        allocation, created, model = self.service.allocate(parsed)
        return pb.AllocateResponse(
            allocation=allocation_to_pb(allocation), created=created, model=model
        )

    async def Release(
        self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReleaseResponse:
        self._check_container_id(request.container_id, held_ok=True)
        released = self.service.release(request.container_id)
        if released is None:
            return pb.ReleaseResponse(released=False)
        return pb.ReleaseResponse(released=True, allocation=allocation_to_pb(released))

    async def PrepareContainer(
        self, request: pb.PrepareContainerRequest, context: grpc.aio.ServicerContext
    ) -> pb.PrepareContainerResponse:
        injector = await self._injector(context)
        if not request.container_id:  # the injector checks the id of a container it serves
            raise self._invalid("", "container_id is required")
        front_end = FrontEnd.parse(request.front_end)
        if front_end not in _CONTAINER_FRONT_ENDS:
            front_end = FrontEnd.UNKNOWN
        info = ContainerInfo(
            container_id=request.container_id,
            container_name=request.container_name,
            pod=PodRef(request.pod.namespace, request.pod.name, request.pod.uid),
            container_annotations=dict(request.container_annotations),
            pod_annotations=dict(request.pod_annotations),
            front_end=front_end,
            user=(
                ContainerUser(request.user.uid, request.user.gid)
                if request.HasField("user")
                else None
            ),
        )
        edits = injector.create(info)
        if edits is None:
            return pb.PrepareContainerResponse(managed=False)
        if request.HasField("spec"):
            injector.verify_injected(info, edits, _view(request.spec))
        held = self.service.allocation(request.container_id)
        return pb.PrepareContainerResponse(
            managed=True,
            devices=[
                pb.DeviceNode(
                    path=n.path,
                    major=n.major,
                    minor=n.minor,
                    type=n.kind,
                    permissions=n.permissions,
                )
                for n in edits.devices
            ],
            env=dict(edits.env),
            mounts=[
                pb.Mount(host_path=m.host_path, container_path=m.container_path, options=m.options)
                for m in edits.mounts
            ],
            allocation=allocation_to_pb(held) if held is not None else None,
        )

    async def ContainerGone(
        self, request: pb.ContainerGoneRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReleaseResponse:
        injector = await self._injector(context)
        self._check_container_id(request.container_id, held_ok=True)
        held = self.service.allocation(request.container_id)
        if request.deleted:
            injector.removed(request.container_id)
        else:
            injector.stopped(request.container_id)
        if held is None:
            return pb.ReleaseResponse(released=False)
        return pb.ReleaseResponse(released=True, allocation=allocation_to_pb(held))

    async def InstallKeys(
        self, request: pb.InstallKeysRequest, context: grpc.aio.ServicerContext
    ) -> pb.InstallKeysResponse:
        """hcs-syncer hands over this node's keys; only root reaches this socket."""
        injector = await self._injector(context)
        settings = injector.settings
        path = settings.runtime.assignment_keyring_file
        try:
            keyring = decode_keyring(request.keyring, "the keyring sent")
            if keyring.node != settings.node_name:
                raise AssignmentKeyError(
                    f"the keyring sent is node {keyring.node!r}'s; this is {settings.node_name!r}"
                )
            changed = write_keyring(path, keyring)
        except AssignmentKeyError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"InstallKeys: {e}")
            raise AssertionError from e  # unreachable: abort raises
        except OSError as e:
            await context.abort(grpc.StatusCode.INTERNAL, f"failed to write {path}: {e}")
            raise AssertionError from e
        if changed:
            log.info(
                "assignment keys installed at %s: ids %s, signing %s",
                path,
                ", ".join(sorted(keyring.keys)),
                keyring.signing or "-",
            )
        return pb.InstallKeysResponse(
            changed=changed, key_ids=sorted(keyring.keys), signing=keyring.signing
        )

    async def Measure(
        self, request: pb.MeasureRequest, context: grpc.aio.ServicerContext
    ) -> pb.MeasureResponse:
        measure = self.measure
        if measure is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this hcsd does not measure")
            return pb.MeasureResponse()
        outcomes = await measure(list(request.device_uuids))
        return pb.MeasureResponse(results=[outcome_to_pb(o) for o in outcomes])

    async def Watch(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Event]:
        subscription = self.service.subscribe(send_initial=request.send_initial)
        try:
            async for event in subscription:
                yield event_to_pb(event)
        except WatchOverflow as e:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{e}; reconnect")
        finally:
            subscription.close()

    async def _injector(self, context: grpc.aio.ServicerContext) -> Injector:
        """The injector the container and key calls need; UNAVAILABLE for a server built
        without one (the API alone, as some clients and tests run it)."""
        if self.injector is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "runtime integration is disabled")
            raise AssertionError  # unreachable: abort raises
        return self.injector

    def _check_container_id(self, container_id: str, *, held_ok: bool = False) -> None:
        """Refuse an id the runtime would not accept either (INVALID_ARGUMENT), before it
        reaches a log line, the ledger or a directory name. `held_ok`: an id the ledger holds
        (recorded before this check existed) may still be released."""
        problem = container_id_problem(container_id)
        if problem is None or (held_ok and self.service.allocation(container_id) is not None):
            return
        raise self._invalid("", f"invalid request: {problem}")

    def _invalid(self, container_id: str, message: str) -> Refusal:
        """A malformed request, counted and logged like every other refusal."""
        text = f"{container_id}: {message}" if container_id else message
        return self.service.refuse(Refusal(Reason.INVALID_REQUEST, text))


def _view(spec: pb.ContainerSpec) -> ContainerView:
    return ContainerView.of(
        device_paths=spec.device_paths,
        mounts=((m.container_path, m.host_path) for m in spec.mounts),
        env=spec.env,
    )


class ApiServer:
    """grpc.aio server bound to one unix socket."""

    def __init__(
        self,
        service: NodeService,
        socket_path: str,
        injector: Injector | None = None,
        telemetry: Telemetry | None = None,
        *,
        measure: Measure | None = None,
    ) -> None:
        self.socket_path = socket_path
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.max_send_message_length", MAX_MESSAGE),
                ("grpc.so_reuseport", 0),
            ]
        )
        self._server.add_generic_rpc_handlers(
            (handlers(HcsdServicer(service, injector, measure), telemetry),)
        )

    async def start(self) -> None:
        directory = os.path.dirname(self.socket_path) or "."
        os.makedirs(directory, mode=0o755, exist_ok=True)
        _remove_stale_socket(self.socket_path)
        # grpc binds (and so creates the socket file) in add_insecure_port: the umask is set
        # around that call alone and restored before the await, so no other task of hcsd ever
        # creates a file under it.
        old_umask = os.umask(0o177)
        try:
            self._server.add_insecure_port(f"unix:{self.socket_path}")
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, 0o600)
        await self._server.start()
        log.info("API listening on %s", self.socket_path)

    async def stop(self, grace: float) -> None:
        """Stop taking calls; let calls in flight finish for up to `grace` seconds."""
        await self._server.stop(grace)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)


def _remove_stale_socket(path: str) -> None:
    try:
        if remove_stale_socket(path):
            log.info("removed stale socket %s", path)
    except FileExistsError:
        raise SocketInUse(f"another process serves {path}; is hcsd already running?") from None
