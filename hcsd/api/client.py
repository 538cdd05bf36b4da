"""A blocking client of the local API, for hcsctl, the front ends and hcs-syncer.

Errors become ApiError with one line that a person can act on: the socket path and the reason
the daemon gave (or why it could not be reached). A refusal comes back as the daemon's
`Refusal` (reason from the trailing metadata), so its text names the reason and says whether
a retry may succeed, in every front end that prints it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import grpc

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.api.v1 import hcsd_pb2_grpc as pb_grpc
from hcsd.refusals import METADATA_KEY, Refusal

__all__ = ["ApiError", "Client"]


class ApiError(Exception):
    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = None,
        refusal: Refusal | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.refusal = refusal


class Client:
    def __init__(self, socket_path: str, *, timeout: float = 10.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._channel = grpc.insecure_channel(f"unix:{socket_path}")
        self._stub = pb_grpc.HcsdStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def node(self) -> pb.Node:
        return self._call(self._stub.GetNode, pb.GetNodeRequest())  # type: ignore[no-any-return]

    def devices(self) -> list[pb.Device]:
        response = self._call(self._stub.ListDevices, pb.ListDevicesRequest())
        return list(response.devices)

    def allocations(self) -> list[pb.Allocation]:
        response = self._call(self._stub.ListAllocations, pb.ListAllocationsRequest())
        return list(response.allocations)

    def allocate(self, request: pb.AllocateRequest) -> pb.AllocateResponse:
        return self._call(self._stub.Allocate, request)  # type: ignore[no-any-return]

    def release(self, container_id: str) -> pb.ReleaseResponse:
        request = pb.ReleaseRequest(container_id=container_id)
        return self._call(self._stub.Release, request)  # type: ignore[no-any-return]

    def prepare_container(self, request: pb.PrepareContainerRequest) -> pb.PrepareContainerResponse:
        return self._call(self._stub.PrepareContainer, request)  # type: ignore[no-any-return]

    def container_gone(self, request: pb.ContainerGoneRequest) -> pb.ReleaseResponse:
        return self._call(self._stub.ContainerGone, request)  # type: ignore[no-any-return]

    def install_keys(self, keyring: str) -> pb.InstallKeysResponse:
        request = pb.InstallKeysRequest(keyring=keyring)
        return self._call(self._stub.InstallKeys, request)  # type: ignore[no-any-return]

    def prepare_claim(self, request: pb.PrepareClaimRequest) -> pb.PrepareClaimResponse:
        return self._call(self._stub.PrepareClaim, request)  # type: ignore[no-any-return]

    def unprepare_claim(self, claim_uid: str) -> pb.UnprepareClaimResponse:
        request = pb.UnprepareClaimRequest(claim_uid=claim_uid)
        return self._call(self._stub.UnprepareClaim, request)  # type: ignore[no-any-return]

    def measure(self, uuids: list[str], *, timeout: float) -> list[pb.MeasureResult]:
        """Measure now; `timeout` rather than the client's: a pass takes seconds per device."""
        try:
            response = self._stub.Measure(pb.MeasureRequest(device_uuids=uuids), timeout=timeout)
        except grpc.RpcError as e:
            raise self._error(e) from None
        return list(response.results)

    def watch(self, *, send_initial: bool = True) -> Iterator[pb.Event]:
        try:
            yield from self._stub.Watch(pb.WatchRequest(send_initial=send_initial))
        except grpc.RpcError as e:
            raise self._error(e) from None

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise self._error(e) from None

    def _error(self, error: grpc.RpcError) -> ApiError:
        code = error.code()
        details = error.details() or ""
        if code is grpc.StatusCode.UNAVAILABLE and not _reachable(self.socket_path):
            return ApiError(
                f"cannot reach hcsd at {self.socket_path}: {_why_unreachable(self.socket_path)}",
                code,
            )
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return ApiError(f"hcsd at {self.socket_path} did not answer in {self.timeout}s", code)
        refusal = _refusal(error, details)
        if refusal is not None:
            return ApiError(refusal.describe(), code, refusal)
        return ApiError(details or code.name.lower(), code)


def _refusal(error: grpc.RpcError, details: str) -> Refusal | None:
    metadata = error.trailing_metadata() or ()
    for key, value in metadata:
        if key == METADATA_KEY and isinstance(value, str):
            return Refusal.parse(value, details)
    return None


def _reachable(path: str) -> bool:
    return os.path.exists(path) and os.access(path, os.R_OK | os.W_OK)


def _why_unreachable(path: str) -> str:
    if not os.path.exists(path):
        return "no such socket (is hcsd running? try: systemctl status hcsd)"
    return "permission denied (the socket is root-only; use sudo)"
