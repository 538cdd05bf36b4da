"""What a ComputeNode says of its devices' health: each device's reason and sub-health
signals, the node's sub-health line and node-wide reasons, and why each device is not healthy
for the Ready condition. Read from the device attributes hcsd's health watcher sets; every
string cut to the CRD's limits, since one over them fails the whole status write."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.contract.names import SUBHEALTH_ATTRIBUTE, SUBHEALTH_NODE_ATTRIBUTE
from hcsd.model import HealthState

__all__ = [
    "REASON_MAX",
    "SUBHEALTH_MAX",
    "SUBHEALTH_NAME_MAX",
    "device_reason",
    "device_subhealth",
    "node_subhealth",
    "why",
]

REASON_MAX = 1024  # crds/computenodes.yaml: status.devices[].reason maxLength
SUBHEALTH_MAX, SUBHEALTH_NAME_MAX = 16, 64  # status.devices[].subhealth maxItems, maxLength
SUBHEALTH_SUMMARY_MAX = 1024  # status.subhealth maxLength
CAUSE_MAX = 200  # a device's cause in the Ready message (stable words, short)


def device_reason(device: pb.Device, state: HealthState) -> dict[str, str]:
    """`reason`: why the device is not healthy, from its health_reason attribute (the health
    watcher's latest event, hot-plug's removal); absent for a healthy device or when there is
    none. Cut to the CRD's maxLength: a longer string would fail the whole status write."""
    reason = device.attributes.get("health_reason", "")[:REASON_MAX]
    return {"reason": reason} if reason and state is not HealthState.HEALTHY else {}


def _words(device: pb.Device, key: str) -> list[str]:
    return [n[:SUBHEALTH_NAME_MAX] for n in device.attributes.get(key, "").split(",") if n][
        :SUBHEALTH_MAX
    ]


def why(device: pb.Device, state: HealthState) -> str:
    """`<uuid> <state>: <cause>`, the cause in the health watcher's stable words."""
    cause = device.attributes.get("health_cause", "")[:CAUSE_MAX]
    return f"{device.uuid} {state.value}" + (f": {cause}" if cause else "")


def node_subhealth(devices: Sequence[pb.Device]) -> dict[str, Any]:
    """`subhealth`: one line for the printer column, the devices that sub-health signals hold
    degraded and why, then the node-wide clock reasons (`nodeSubhealth`: a power brake or a
    hot room seen on every device, which degrades none of them). Both absent while nothing
    holds."""
    node = sorted({n for d in devices for n in _words(d, SUBHEALTH_NODE_ATTRIBUTE)})
    parts = [
        f"{d.uuid}: {','.join(words)}"
        for d in sorted(devices, key=lambda d: d.uuid)
        if (words := _words(d, SUBHEALTH_ATTRIBUTE))
    ]
    if node:
        parts.append(f"node: {','.join(node)}")
    if not parts:
        return {}
    return {
        "subhealth": "; ".join(parts)[:SUBHEALTH_SUMMARY_MAX],
        **({"nodeSubhealth": node[:SUBHEALTH_MAX]} if node else {}),
    }


def device_subhealth(device: pb.Device) -> dict[str, list[str]]:
    """`subhealth`: the named signals that hold the device degraded (`hw-slowdown`,
    `pcie-link-width`, `ecc-correctable-rising`, `below-profile-tflops`, …; docs/health.md),
    from its `subhealth` attribute; absent while none does."""
    names = _words(device, SUBHEALTH_ATTRIBUTE)
    return {"subhealth": names} if names else {}
