"""Method handlers that decode requests themselves, and turn a `Refusal` into its status.

grpc's own decoding answers a corrupt frame with UNKNOWN and a Python exception text; here it
is INVALID_ARGUMENT with the message type named, like any other bad input. A `Refusal` raised
by a method becomes the status code of hcsd/refusals.py's table, with the message as details
and the reason in the trailing metadata (METADATA_KEY).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.refusals import METADATA_KEY, Refusal
from hcsd.telemetry import Telemetry

__all__ = ["grpc_code", "handlers"]

_GRPC_CODES = {code.value[0]: code for code in grpc.StatusCode}


def grpc_code(refusal: Refusal) -> grpc.StatusCode:
    """The refusal's code from the table, as grpc names it (the numbers are gRPC's own)."""
    return _GRPC_CODES[refusal.code.value]


async def _abort_refused(context: grpc.aio.ServicerContext, refusal: Refusal) -> None:
    await context.abort(
        grpc_code(refusal),
        str(refusal),
        trailing_metadata=((METADATA_KEY, refusal.reason.value),),
    )


def handlers(servicer: Any, telemetry: Telemetry | None) -> grpc.GenericRpcHandler:
    """Method handlers that decode requests themselves.

    grpc's own decoding answers a corrupt frame with UNKNOWN and a Python exception text; here
    it is INVALID_ARGUMENT with the message type named, like any other bad input.
    """
    descriptor = pb.DESCRIPTOR.services_by_name["Hcsd"]
    handlers = {}
    for method in descriptor.methods:
        request_type = getattr(pb, method.input_type.name)
        implementation = getattr(servicer, method.name)
        if method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                _decoding_stream(implementation, request_type),
                response_serializer=_serialize,
            )
        else:
            if telemetry is not None:  # every method's series from the start: rates see 0 → 1
                telemetry.api.labels(method.name)
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _decoding_unary(implementation, request_type, method.name, telemetry),
                response_serializer=_serialize,
            )
    return grpc.method_handlers_generic_handler(descriptor.full_name, handlers)


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


async def _decode(data: bytes, request_type: Any, context: grpc.aio.ServicerContext) -> Any:
    try:
        return request_type.FromString(data)
    except DecodeError as e:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"malformed {request_type.DESCRIPTOR.name}: {e}",
        )


def _decoding_unary(
    implementation: Callable[..., Awaitable[Any]],
    request_type: Any,
    name: str,
    telemetry: Telemetry | None,
) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Any]]:
    async def handle(data: bytes, context: grpc.aio.ServicerContext) -> Any:
        request = await _decode(data, request_type, context)
        with telemetry.timed(telemetry.api, name) if telemetry else contextlib.nullcontext():
            try:
                return await implementation(request, context)
            except Refusal as e:
                await _abort_refused(context, e)

    return handle


def _decoding_stream(
    implementation: Callable[..., AsyncIterator[Any]], request_type: Any
) -> Callable[[bytes, grpc.aio.ServicerContext], AsyncIterator[Any]]:
    async def handle(data: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for item in implementation(await _decode(data, request_type, context), context):
            yield item

    return handle
