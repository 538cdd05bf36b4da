"""The runtime's side of an NRI connection, for tests: serves Runtime.RegisterPlugin on conn 2
and calls the plugin's methods on conn 1, using the same mux and ttrpc layers."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from hcsd.runtime.nri.mux import Mux
from hcsd.runtime.nri.ttrpc import Client, Server
from hcsd.runtime.nri.v1alpha1 import api_pb2 as api

M = TypeVar("M")


class RuntimePeer:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.mux = Mux(reader, writer)
        calls_to_plugin = self.mux.open(1)
        calls_from_plugin = self.mux.open(2)
        self.registration: api.RegisterPluginRequest | None = None
        self.registered = asyncio.Event()
        server = Server(
            {("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin"): self._register},
            lambda data: self.mux.send(2, data),
        )
        self.client = Client(lambda data: self.mux.send(1, data))
        self.tasks = [
            asyncio.create_task(self.mux.run()),
            asyncio.create_task(server.serve(calls_from_plugin)),
            asyncio.create_task(self.client.receive(calls_to_plugin)),
        ]

    async def _register(self, payload: bytes) -> bytes:
        self.registration = api.RegisterPluginRequest.FromString(payload)
        self.registered.set()
        return api.Empty().SerializeToString()

    async def call(self, method: str, request: Any, response_type: type[M]) -> M:
        data = await self.client.call(
            "nri.pkg.api.v1alpha1.Plugin", method, request.SerializeToString(), timeout=2
        )
        return response_type.FromString(data)  # type: ignore[attr-defined,no-any-return]

    def close(self) -> None:
        self.mux.close()
        for task in self.tasks:
            task.cancel()
