"""What one measurement is asked to do: the worker's whole input, as JSON on its command line."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

__all__ = ["GemmRequest"]


@dataclass(frozen=True, slots=True)
class GemmRequest:
    vendor: str  # "nvidia", "hygon", … (a Vendor's value)
    size: int = 8192  # M = N = K
    duration: float = 3.0  # seconds of timed GEMMs
    warmup: float = 0.5  # seconds of GEMMs before, untimed
    compute: str = "fp32"  # accumulate in FP32 (the datasheets' dense FP16 figure) or FP16
    bandwidth: bool = True
    copy_bytes: int = 256 << 20
    library_path: tuple[str, ...] = ()  # directories searched before the loader's path
    ascend_op_models: str = ""  # aclopSetModelDir's directory (Ascend)
    pci_bus_id: str = ""  # the device discovery found: the worker must land on it

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> GemmRequest:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("expected an object")
        data["library_path"] = tuple(data.get("library_path", ()))
        request = cls(**data)
        if (
            request.size <= 0
            or request.duration <= 0
            or request.warmup < 0
            or request.compute not in ("fp32", "fp16")
        ):
            raise ValueError(f"invalid request {text}")
        return request
