"""Coverage-guided fuzzing of everything hcsd parses from the runtime's socket.

Input bytes go through the mux reader, the ttrpc server (with a handler that decodes NRI's
CreateContainer and runs the annotation parsing on it) and the ttrpc client's response path.
The only acceptable outcomes are a clean result or our own protocol errors; anything else
(an unexpected exception, a hang) is a finding. Run: python tests/nri/fuzz_transport.py
-atheris_runs=N (tests/nri/test_fuzz.py runs it for a bounded time).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

import atheris

with atheris.instrument_imports():
    from google.protobuf.message import DecodeError

    from hcsd.model import PodRef
    from hcsd.runtime.annotations import RequestError, local_request
    from hcsd.runtime.nri import ttrpc_pb2 as wire
    from hcsd.runtime.nri.mux import Mux, MuxError
    from hcsd.runtime.nri.ttrpc import Client, Server, TtrpcError, read_message
    from hcsd.runtime.nri.v1alpha1 import api_pb2 as api


class _Sink:
    """A StreamWriter stand-in that swallows what the mux writes."""

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


async def _handler(payload: bytes) -> bytes:
    request = api.ContainerRequest.FromString(payload)
    with contextlib.suppress(RequestError, ValueError):
        local_request(
            request.container.id or "x",
            request.container.name,
            PodRef(request.pod.namespace, request.pod.name, request.pod.uid),
            dict(request.container.annotations),
            dict(request.pod.annotations),
        )
    return b""


async def _decode_all(data: bytes) -> None:
    """The handler path: every well-framed request on conn 1 decoded and handled in turn."""
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    mux = Mux(reader, _Sink())  # type: ignore[arg-type]
    side = mux.open(1)
    with contextlib.suppress(MuxError):
        await mux.run()
    while True:
        try:
            message = await read_message(side)
        except TtrpcError:
            return
        if message is None:
            return
        with contextlib.suppress(DecodeError):
            await _handler(wire.Request.FromString(message[2]).payload)


async def _run(data: bytes) -> None:
    await _decode_all(data)
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    mux = Mux(reader, _Sink())  # type: ignore[arg-type]
    server_side = mux.open(1)
    client_side = mux.open(2)
    server = Server(
        {("nri.pkg.api.v1alpha1.Plugin", "CreateContainer"): _handler}, lambda _data: None
    )
    client = Client(lambda _data: None)
    with contextlib.suppress(MuxError):
        await mux.run()
    for side, consume in ((server_side, server.serve), (client_side, client.receive)):
        with contextlib.suppress(TtrpcError, DecodeError):
            await asyncio.wait_for(consume(side), 2)
    await asyncio.sleep(0)  # let handler tasks finish


def test_one_input(data: bytes) -> None:
    asyncio.run(_run(data))


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
