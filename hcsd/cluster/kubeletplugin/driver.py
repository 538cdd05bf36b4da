"""The gRPC services kubelet calls: plugin registration, and the DRA service (v1, v1beta1).

Prepare: per claim, read it (claims.py), resolve the RuntimeProfile it names for its devices
(profiles.py), ask hcsd to hold its devices and write its CDI spec,
and answer with the CDI ids hcsd returns. A claim that fails carries its error in the answer
(kubelet retries that claim); the others of the same call are still prepared. Unprepare needs
no read: hcsd releases by uid, and a claim already gone from the API server is released all
the same. Both are idempotent in hcsd, so kubelet repeating a call (after a restart of
kubelet, of this process or of hcsd) gets the same answer.

The two DRA versions differ only in v1's `share_id`; one implementation serves both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

import grpc

from hcsd.api.client import ApiError, Client
from hcsd.cluster.kube import Kube
from hcsd.cluster.kubeletplugin.claims import (
    ClaimError,
    base_request,
    prepare_request,
    read_claim,
)
from hcsd.cluster.kubeletplugin.profiles import add_runtime
from hcsd.cluster.kubeletplugin.wire import dra_v1_pb2, dra_v1beta1_pb2, registration_v1_pb2
from hcsd.contract import dra
from hcsd.contract.names import ANNOTATION_RUNTIME_PROFILE
from hcsd.profiles.database import ProfileDatabase, default_database

__all__ = ["DRA_VERSIONS", "DraService", "Registration", "handlers"]

log = logging.getLogger(__name__)

#: What GetInfo announces, and the module of each version's messages.
DRA_VERSIONS: dict[str, ModuleType] = {
    "v1.DRAPlugin": dra_v1_pb2,
    "v1beta1.DRAPlugin": dra_v1beta1_pb2,
}
PLUGIN_TYPE = "DRAPlugin"


class DraService:
    """NodePrepareResources / NodeUnprepareResources for one version's messages."""

    def __init__(
        self, kube: Kube, hcsd_socket: str, wire: ModuleType, db: ProfileDatabase | None = None
    ) -> None:
        self.kube = kube
        self.db = db or default_database()  # model aliases in RuntimeProfiles
        self.hcsd_socket = hcsd_socket
        self.wire = wire

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        answer = self.wire.NodePrepareResourcesResponse()
        with Client(self.hcsd_socket, timeout=30) as hcsd:
            for claim in request.claims:
                label = f"{claim.namespace}/{claim.name} ({claim.uid})"
                try:
                    found = read_claim(self.kube, claim.namespace, claim.name, claim.uid)
                    prepare = prepare_request(found)
                    if ANNOTATION_RUNTIME_PROFILE in (found["metadata"].get("annotations") or {}):
                        add_runtime(prepare, found, self.kube, hcsd.devices(), self.db)
                    prepared = hcsd.prepare_claim(prepare)
                except (ClaimError, ApiError) as e:
                    log.warning("claim %s: failed to prepare: %s", label, e)
                    answer.claims[claim.uid].error = f"failed to prepare: {e}"
                    continue
                devices = answer.claims[claim.uid].devices
                for d in prepared.devices:
                    device = devices.add(
                        request_names=[base_request(d.request)],
                        pool_name=d.pool,
                        device_name=d.device,
                        cdi_device_ids=list(d.cdi_device_ids),
                    )
                    if d.share_id and "share_id" in device.DESCRIPTOR.fields_by_name:
                        device.share_id = d.share_id
                log.info(
                    "claim %s: prepared %s",
                    label,
                    ", ".join(i for d in prepared.devices for i in d.cdi_device_ids),
                )
        return answer

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        answer = self.wire.NodeUnprepareResourcesResponse()
        with Client(self.hcsd_socket, timeout=30) as hcsd:
            for claim in request.claims:
                label = f"{claim.namespace}/{claim.name} ({claim.uid})"
                try:
                    released = hcsd.unprepare_claim(claim.uid).released
                except ApiError as e:
                    log.warning("claim %s: failed to unprepare: %s", label, e)
                    answer.claims[claim.uid].error = f"failed to unprepare: {e}"
                    continue
                answer.claims[claim.uid].SetInParent()
                if released:
                    log.info("claim %s: released", label)
        return answer


class Registration:
    """pluginregistration.Registration: what kubelet's plugin watcher asks on our socket."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.registered = False
        self.error = ""

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return registration_v1_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=dra.DRIVER,
            endpoint=self.endpoint,
            supported_versions=list(DRA_VERSIONS),
        )

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.registered, self.error = request.plugin_registered, request.error
        if request.plugin_registered:
            log.info("kubelet registered the DRA plugin %s at %s", dra.DRIVER, self.endpoint)
        else:
            log.error("kubelet did not register the DRA plugin %s: %s", dra.DRIVER, request.error)
        return registration_v1_pb2.RegistrationStatusResponse()


def handlers(servicer: object, wire: ModuleType, service: str) -> grpc.GenericRpcHandler:
    """Unary handlers of `wire`'s `service`, each calling the servicer's method of its name."""
    descriptor = wire.DESCRIPTOR.services_by_name[service]
    methods: dict[str, grpc.RpcMethodHandler] = {}
    for method in descriptor.methods:
        implementation: Callable[..., Any] = getattr(servicer, method.name)
        methods[method.name] = grpc.unary_unary_rpc_method_handler(
            implementation,
            request_deserializer=getattr(wire, method.input_type.name).FromString,
            response_serializer=lambda m: m.SerializeToString(),
        )
    return grpc.method_handlers_generic_handler(descriptor.full_name, methods)
