"""Allocations to and from the msgpack maps stored in journal and snapshot records.

Short keys keep records small (one fsync'd write per operation); decoding checks every field so
that a record written by a buggy or newer build fails loudly instead of half-loading. Fields
added later are optional on reading, so journals and snapshots written before them still load:
`f` (the front end that made the allocation) reads as "unknown" when absent.
"""

from __future__ import annotations

from typing import Any

import msgpack

from hcsd.model import Acceptance, Allocation, FrontEnd, Grant, PodRef

__all__ = [
    "decode",
    "decode_acceptance",
    "decode_allocation",
    "encode",
    "encode_acceptance",
    "encode_allocation",
    "payload_size",
]


def encode(record: dict[str, Any]) -> bytes:
    data: bytes = msgpack.packb(record, use_bin_type=True)
    return data


def decode(payload: bytes) -> dict[str, Any]:
    record = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    if not isinstance(record, dict):
        raise ValueError("record is not a map")
    return record


def payload_size(data: bytes) -> int | None:
    """Bytes taken by the one msgpack object `data` starts with; None if it holds no whole one.

    Replay uses it to tell a record cut short by a crash (never a whole object) from one whose
    length field was damaged (a whole object, with the record's checksum, is there).
    """
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    try:
        unpacker.skip()
    except (msgpack.UnpackException, ValueError):
        return None
    size: int = unpacker.tell()
    return size


def encode_allocation(allocation: Allocation) -> dict[str, Any]:
    pod = allocation.pod
    return {
        "c": allocation.container_id,
        "g": [[g.device_uuid, g.vram_bytes, g.compute_percent] for g in allocation.grants],
        "p": [pod.namespace, pod.name, pod.uid],
        "n": allocation.container_name,
        "t": allocation.created,
        "o": allocation.source,
        "f": allocation.front_end.value,
    }


def decode_allocation(raw: dict[str, Any]) -> Allocation:
    grants = []
    for item in raw["g"]:
        uuid, vram, compute = item
        if not isinstance(uuid, str) or not isinstance(vram, int) or not isinstance(compute, int):
            raise ValueError(f"bad grant {item!r}")
        grants.append(Grant(device_uuid=uuid, vram_bytes=vram, compute_percent=compute))
    namespace, name, uid = raw["p"]
    return Allocation(
        container_id=str(raw["c"]),
        grants=tuple(grants),
        pod=PodRef(namespace=str(namespace), name=str(name), uid=str(uid)),
        container_name=str(raw["n"]),
        created=float(raw["t"]),
        source=str(raw["o"]),
        front_end=FrontEnd(str(raw.get("f", FrontEnd.UNKNOWN.value))),
    )


def encode_acceptance(acceptance: Acceptance) -> list[Any]:
    return [acceptance.pod_uid, acceptance.digest, acceptance.accepted_at]


def decode_acceptance(raw: Any) -> Acceptance:
    pod_uid, digest, accepted_at = raw
    if not isinstance(pod_uid, str) or not isinstance(digest, str):
        raise ValueError(f"bad acceptance {raw!r}")
    return Acceptance(pod_uid, digest, float(accepted_at))
