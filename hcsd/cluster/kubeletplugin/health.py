"""kubelet's DRA health service (v1alpha1 `NodeWatchResources`): hcsd's device health, streamed.

kubelet 1.36 (feature gate ResourceHealthStatus, beta and on by default) opens one stream per
registered plugin and shows each allocated device's health in the pod status
(`allocatedResourcesStatus`). Every message is the whole list of this node's devices, named
as the ResourceSlice names them (pool: the node, device: `<vendor>-<index>`):
- hcsd `healthy` and `degraded` are Healthy (a degraded device stays schedulable, as in the
  slice's taints), `unhealthy` and `lost` Unhealthy, anything else Unknown;
- a message goes out when hcsd's watch has sent its initial state, on every change, and every
  `resend` seconds without one: kubelet takes a device not reported within its health
  timeout (announced here, `TIMEOUT`) as Unknown;
- while hcsd does not answer, every device known is reported Unknown, and the watch is dialled
  again every `retry` seconds.

hcsd's watch runs in a thread of the stream's own; kubelet closing the stream closes it.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

from hcsd.api.client import ApiError, Client
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.dra_slices import device_name
from hcsd.cluster.kubeletplugin.wire import dra_health_v1alpha1_pb2 as wire

__all__ = ["HealthService", "health_handler", "health_of"]

log = logging.getLogger(__name__)

RESEND = 10.0  # seconds between messages without a change
TIMEOUT = 30  # seconds: the health_check_timeout_seconds announced per device
RETRY = 2.0  # seconds between dials of hcsd's watch

_HEALTH = {
    pb.HEALTH_STATE_HEALTHY: wire.HEALTHY,
    pb.HEALTH_STATE_DEGRADED: wire.HEALTHY,
    pb.HEALTH_STATE_UNHEALTHY: wire.UNHEALTHY,
    pb.HEALTH_STATE_LOST: wire.UNHEALTHY,
}

# uuid -> (device name, kubelet's health, message)
Snapshot = dict[str, tuple[str, int, str]]


def health_of(device: pb.Device) -> tuple[int, str]:
    """kubelet's health for an hcsd device, and the message that says hcsd's own state."""
    state = pb.HealthState.Name(device.health_state).removeprefix("HEALTH_STATE_").lower()
    return _HEALTH.get(device.health_state, wire.UNKNOWN), f"hcsd: {state}"


class HealthService:
    """DRAResourceHealth for the devices of one pool (the node)."""

    def __init__(
        self, hcsd_socket: str, pool: str, *, resend: float = RESEND, retry: float = RETRY
    ) -> None:
        self.hcsd_socket = hcsd_socket
        self.pool = pool
        self.resend = resend
        self.retry = retry

    def NodeWatchResources(
        self, request: Any, context: grpc.ServicerContext
    ) -> Iterator[wire.NodeWatchResourcesResponse]:
        updates: queue.Queue[Snapshot] = queue.Queue()
        stop = threading.Event()
        follower = _Follower(self.hcsd_socket, updates, stop, self.retry)
        context.add_callback(follower.close)
        threading.Thread(target=follower.run, name="dra-health", daemon=True).start()
        log.info("kubelet watches device health (pool %s)", self.pool)
        devices: Snapshot = {}
        try:
            while not stop.is_set():
                # Nothing new within `resend`: the same list again, before kubelet's timeout.
                with contextlib.suppress(queue.Empty):
                    devices = updates.get(timeout=self.resend)
                if devices:
                    yield self._message(devices)
        finally:
            follower.close()

    def _message(self, devices: Snapshot) -> wire.NodeWatchResourcesResponse:
        now = int(time.time())
        return wire.NodeWatchResourcesResponse(
            devices=[
                wire.DeviceHealth(
                    device=wire.DeviceIdentifier(pool_name=self.pool, device_name=name),
                    health=health,  # type: ignore[arg-type]
                    last_updated_time=now,
                    health_check_timeout_seconds=TIMEOUT,
                    message=message[:1024],
                )
                for name, health, message in sorted(devices.values())
            ]
        )


class _Follower:
    """hcsd's watch, as snapshots of every device's health put on `updates`."""

    def __init__(
        self, socket: str, updates: queue.Queue[Snapshot], stop: threading.Event, retry: float
    ) -> None:
        self.socket = socket
        self.updates = updates
        self.stop = stop
        self.retry = retry
        self.client: Client | None = None
        self.known: Snapshot = {}

    def close(self) -> None:
        self.stop.set()
        if (client := self.client) is not None:
            client.close()  # ends a watch that waits for hcsd's next event

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._follow()
            except (ApiError, ValueError) as e:
                if self.stop.is_set():
                    return
                log.warning("device health: hcsd's watch failed: %s (devices Unknown)", e)
            if self.known:
                self.known = {
                    u: (n, wire.UNKNOWN, "hcsd does not answer")
                    for u, (n, _, _) in self.known.items()
                }
                self.updates.put(dict(self.known))
            self.stop.wait(self.retry)

    def _follow(self) -> None:
        self.client = Client(self.socket, timeout=10)
        synced = False
        for event in self.client.watch(send_initial=True):
            if self.stop.is_set():
                return
            if event.HasField("device") and event.device.uuid:
                health, message = health_of(event.device)
                self.known[event.device.uuid] = (device_name(event.device), health, message)
                if synced:
                    self.updates.put(dict(self.known))
            if event.kind == pb.Event.KIND_SYNCED:
                synced = True
                self.updates.put(dict(self.known))


def health_handler(service: HealthService) -> grpc.GenericRpcHandler:
    """The service's one server-streaming method, as kubelet dials it."""
    descriptor = wire.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    method = grpc.unary_stream_rpc_method_handler(
        service.NodeWatchResources,
        request_deserializer=wire.NodeWatchResourcesRequest.FromString,
        response_serializer=lambda m: m.SerializeToString(),
    )
    return grpc.method_handlers_generic_handler(
        descriptor.full_name, {"NodeWatchResources": method}
    )
