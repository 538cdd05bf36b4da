"""A small CRI client (what kubelet or crictl would send), from cri.proto compiled at test
time into a temporary directory."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

HERE = Path(__file__).resolve().parent
_modules: tuple[ModuleType, ModuleType] | None = None


def _compile() -> tuple[ModuleType, ModuleType]:
    global _modules  # noqa: PLW0603 - compiled once per test session
    if _modules is None:
        out = Path(tempfile.mkdtemp(prefix="hcs-cri-"))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{HERE}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                str(HERE / "cri.proto"),
            ],
            check=True,
        )
        sys.path.insert(0, str(out))
        _modules = (importlib.import_module("cri_pb2"), importlib.import_module("cri_pb2_grpc"))
    return _modules


class CriError(Exception):
    """The runtime refused; the message is its own error text."""


class Cri:
    def __init__(self, socket: Path) -> None:
        self.pb, grpc_module = _compile()
        self.channel = grpc.insecure_channel(f"unix:{socket}")
        self.stub = grpc_module.RuntimeServiceStub(self.channel)

    def call(self, method: str, timeout: float = 30, **fields: Any) -> Any:
        request = getattr(self.pb, f"{method}Request")(**fields)
        try:
            return getattr(self.stub, method)(request, timeout=timeout)
        except grpc.RpcError as e:
            raise CriError(e.details() or str(e.code())) from None

    def close(self) -> None:
        self.channel.close()
