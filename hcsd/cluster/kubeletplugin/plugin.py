"""The kubelet DRA plugin's sockets and servers, as hcs-syncer runs them.

Where kubelet (1.36) looks, with `<root>` its root directory (/var/lib/kubelet):
- `<root>/plugins_registry/compute.hcs.io-reg.sock`: the registration service. kubelet watches
  that directory; a socket appearing there is dialled, GetInfo tells it the driver's name and
  endpoint, and NotifyRegistrationStatus says whether it took it. A kubelet that restarts
  walks the directory again and re-registers every socket it finds, so the plugin only has to
  keep serving. The socket going away unregisters the plugin.
- `<root>/plugins/compute.hcs.io/dra.sock`: the DRA service (the endpoint GetInfo names).
With a rolling-update uid (the syncer pod's uid), the names carry it
(`compute.hcs.io-<uid>-reg.sock`, `dra-<uid>.sock`), so that a new syncer pod registers beside
the old one and kubelet may call either while both run (supported since kubelet 1.33); each
call is stateless here (hcsd holds the state), so either instance answers the same.

A socket left by an instance that died (kill -9) is replaced when nobody answers on it; one
that answers belongs to a live instance with the same name, and this one refuses to start.
The registration socket is created last and removed first: kubelet never dials an endpoint
that is not served yet, nor keeps one that is going away.
"""

from __future__ import annotations

import contextlib
import logging
import os
from concurrent import futures
from dataclasses import dataclass

import grpc

from hcsd.api.client import Client
from hcsd.cluster.kube import Kube
from hcsd.cluster.kubeletplugin.driver import DRA_VERSIONS, DraService, Registration, handlers
from hcsd.cluster.kubeletplugin.health import HealthService, health_handler
from hcsd.cluster.kubeletplugin.wire import registration_v1_pb2
from hcsd.contract import dra
from hcsd.fs import remove_stale_socket

__all__ = ["KUBELET_DIR", "KubeletPlugin", "PluginPaths", "SocketInUse"]

log = logging.getLogger(__name__)

KUBELET_DIR = "/var/lib/kubelet"


class SocketInUse(Exception):
    """Another live instance serves on the socket path."""


@dataclass(frozen=True, slots=True)
class PluginPaths:
    registration: str
    endpoint: str

    @classmethod
    def of(cls, kubelet_dir: str = KUBELET_DIR, rolling_uid: str = "") -> PluginPaths:
        part = f"-{rolling_uid}" if rolling_uid else ""
        return cls(
            registration=os.path.join(
                kubelet_dir, "plugins_registry", f"{dra.DRIVER}{part}-reg.sock"
            ),
            endpoint=os.path.join(kubelet_dir, "plugins", dra.DRIVER, f"dra{part}.sock"),
        )


class KubeletPlugin:
    def __init__(self, kube: Kube, hcsd_socket: str, paths: PluginPaths, *, pool: str = "") -> None:
        """`pool`: the node's name, the pool its ResourceSlice and the health service name
        (hcsd's node name when empty)."""
        self.paths = paths
        self.registration = Registration(paths.endpoint)
        # kubelet's health stream holds one worker for as long as it lasts
        self._dra = grpc.server(futures.ThreadPoolExecutor(8, "dra"))
        for wire in DRA_VERSIONS.values():
            service = DraService(kube, hcsd_socket, wire)
            self._dra.add_generic_rpc_handlers((handlers(service, wire, "DRAPlugin"),))
        if not pool:
            with Client(hcsd_socket, timeout=10) as hcsd:
                pool = hcsd.node().name
        self._dra.add_generic_rpc_handlers((health_handler(HealthService(hcsd_socket, pool)),))
        self._registrar = grpc.server(futures.ThreadPoolExecutor(1, "dra-registration"))
        self._registrar.add_generic_rpc_handlers(
            (handlers(self.registration, registration_v1_pb2, "Registration"),)
        )

    def start(self) -> None:
        _bind(self._dra, self.paths.endpoint)
        self._dra.start()
        _bind(self._registrar, self.paths.registration)
        self._registrar.start()
        log.info(
            "DRA plugin %s: serving %s, registering at %s",
            dra.DRIVER,
            self.paths.endpoint,
            self.paths.registration,
        )

    def stop(self, grace: float = 5.0) -> None:
        """Unregister first (the socket goes), then finish the calls in flight."""
        self._registrar.stop(0).wait()
        _unlink(self.paths.registration)
        self._dra.stop(grace).wait()
        _unlink(self.paths.endpoint)


def _bind(server: grpc.Server, path: str) -> None:
    os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
    _remove_stale(path)
    old = os.umask(0o177)  # kubelet runs as root: nobody else needs these sockets
    try:
        server.add_insecure_port(f"unix:{path}")
    finally:
        os.umask(old)


def _remove_stale(path: str) -> None:
    try:
        if remove_stale_socket(path):
            log.info("removed the stale socket %s", path)
    except FileExistsError:
        raise SocketInUse(f"another instance serves {path}") from None


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
