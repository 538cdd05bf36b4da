"""A node described by a TOML data file, so HCS runs and is tested on any machine.

The file lists devices with their fingerprints, device nodes and the links between them
(each link once; it is made symmetric here). Every value is validated with a message that
names the file and the entry, because a demo that starts on a wrong inventory teaches nothing.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hcsd.discovery.backend import DiscoveryBackend, DiscoveryError
from hcsd.model import Device, DeviceNode, HealthState, Link, LinkKind, Vendor
from hcsd.quantity import QuantityError, parse_bytes

__all__ = ["SimulatedBackend", "load_node_file"]

_DEVICE_KEYS = {
    "uuid",
    "vendor",
    "model",
    "index",
    "pci_bus_id",
    "numa_node",
    "vram",
    "tflops_fp16",
    "tflops_bf16",
    "tflops_fp32",
    "tops_int8",
    "nodes",
    "health_score",
    "health_state",
    "attributes",
    "counters",
}
_LINK_KEYS = {"a", "b", "kind", "gbps"}


class SimulatedBackend(DiscoveryBackend):
    """Devices from a node file (see examples/nodes/mixed.toml)."""

    name = "simulated"

    def __init__(self, path: Path) -> None:
        self.path = path

    def discover(self) -> Sequence[Device]:
        return load_node_file(self.path)

    def health_counters(self) -> dict[str, dict[str, int]]:
        """`counters = {...}` of each device, re-read on every poll so a test or a demo can
        raise them in the file while hcsd runs. An unreadable file reports nothing."""
        try:
            data = tomllib.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError):
            return {}
        counters: dict[str, dict[str, int]] = {}
        for raw in data.get("device", []):
            values = raw.get("counters", {}) if isinstance(raw, dict) else {}
            if isinstance(values, dict):
                counters[str(raw.get("uuid"))] = {
                    str(k): v for k, v in values.items() if isinstance(v, int) and v >= 0
                }
        return counters


def load_node_file(path: Path) -> list[Device]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise DiscoveryError(f"failed to read node file {path}: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise DiscoveryError(f"failed to parse node file {path}: {e}") from e
    try:
        return _parse(data)
    except (ValueError, TypeError, KeyError) as e:
        raise DiscoveryError(f"node file {path}: {e}") from e


def _parse(data: Mapping[str, Any]) -> list[Device]:
    unknown = set(data) - {"device", "link", "shared_nodes"}
    if unknown:
        raise ValueError(f"unknown top-level key(s): {', '.join(sorted(unknown))}")
    shared = {
        Vendor.parse(vendor): tuple(_node(text) for text in nodes)
        for vendor, nodes in dict(data.get("shared_nodes", {})).items()
    }
    raw_devices = data.get("device", [])
    if not isinstance(raw_devices, list) or not raw_devices:
        raise ValueError("expected at least one [[device]] table")
    devices = {}
    for position, raw in enumerate(raw_devices):
        device = _device(position, raw, shared)
        if device.uuid in devices:
            raise ValueError(f"device #{position}: duplicate uuid {device.uuid}")
        devices[device.uuid] = device
    links: dict[str, list[Link]] = {uuid: [] for uuid in devices}
    for position, raw in enumerate(data.get("link", [])):
        a, b, kind, gbps = _link(position, raw)
        for left, right in ((a, b), (b, a)):
            if left not in devices:
                raise ValueError(f"link #{position}: unknown device {left}")
            links[left].append(Link(peer_uuid=right, kind=kind, gbps=gbps))
    return [_with_links(d, tuple(links[d.uuid])) for d in devices.values()]


def _device(position: int, raw: Any, shared: Mapping[Vendor, tuple[DeviceNode, ...]]) -> Device:
    where = f"device #{position}"
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a table")
    unknown = set(raw) - _DEVICE_KEYS
    if unknown:
        raise ValueError(f"{where}: unknown key(s): {', '.join(sorted(unknown))}")
    for key in ("uuid", "vendor", "model", "index", "pci_bus_id", "vram"):
        if key not in raw:
            raise ValueError(f"{where}: missing key {key!r}")
    try:
        vram = parse_bytes(str(raw["vram"]), what="vram")
    except QuantityError as e:
        raise ValueError(f"{where}: {e}") from e
    vendor = Vendor.parse(str(raw["vendor"]))
    return Device(
        uuid=str(raw["uuid"]),
        vendor=vendor,
        model=str(raw["model"]),
        index=_int(raw["index"], f"{where}: index"),
        pci_bus_id=str(raw["pci_bus_id"]).lower(),
        numa_node=_int(raw.get("numa_node", -1), f"{where}: numa_node"),
        vram_bytes=vram,
        tflops_fp16=_float(raw.get("tflops_fp16", 0), f"{where}: tflops_fp16"),
        tflops_bf16=_float(raw.get("tflops_bf16", 0), f"{where}: tflops_bf16"),
        tflops_fp32=_float(raw.get("tflops_fp32", 0), f"{where}: tflops_fp32"),
        tops_int8=_float(raw.get("tops_int8", 0), f"{where}: tops_int8"),
        device_nodes=tuple(_node(text) for text in raw.get("nodes", [])),
        shared_nodes=shared.get(vendor, ()),
        health_score=_int(raw.get("health_score", 100), f"{where}: health_score"),
        health_state=HealthState(raw.get("health_state", "healthy")),
        attributes=tuple(sorted((str(k), str(v)) for k, v in raw.get("attributes", {}).items())),
    )


def _link(position: int, raw: Any) -> tuple[str, str, LinkKind, float]:
    where = f"link #{position}"
    if not isinstance(raw, dict) or set(raw) != _LINK_KEYS:
        raise ValueError(f"{where}: expected keys {', '.join(sorted(_LINK_KEYS))}")
    if raw["a"] == raw["b"]:
        raise ValueError(f"{where}: a device cannot link to itself")
    return str(raw["a"]), str(raw["b"]), LinkKind(raw["kind"]), _float(raw["gbps"], where)


def _node(text: str) -> DeviceNode:
    """`/dev/nvidia0:195:0` → DeviceNode; the simulated node has no real /dev to stat."""
    path, _, numbers = str(text).partition(":")
    major, _, minor = numbers.partition(":")
    if not path.startswith("/dev/") or not major.isdigit() or not minor.isdigit():
        raise ValueError(f"device node {text!r}: expected /dev/NAME:MAJOR:MINOR")
    return DeviceNode(path=path, major=int(major), minor=int(minor))


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: expected an integer, got {value!r}")
    return value


def _float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{where}: expected a non-negative number, got {value!r}")
    return float(value)


def _with_links(device: Device, links: tuple[Link, ...]) -> Device:
    from dataclasses import replace

    return replace(device, links=links)
