"""Plain-text tables for hcsctl: aligned columns, no colour, stable column order.

Kept separate from the commands so the layout is tested on data alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from hcsd.api.messages import HEALTH_NAMES
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.contract.names import SUBHEALTH_ATTRIBUTE, SUBHEALTH_NODE_ATTRIBUTE
from hcsd.quantity import format_bytes

__all__ = [
    "allocations_table",
    "devices_table",
    "health_table",
    "measure_table",
    "render",
    "status_lines",
]


def render(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return f"{value:g}" if value else "-"


def _short(uuid: str, keep: int = 8) -> str:
    return uuid if len(uuid) <= 2 * keep + 1 else f"{uuid[:keep]}…{uuid[-keep:]}"


def _health(device: pb.Device) -> str:
    """The state and why: the cause in stable words for a device not healthy (`degraded
    (hw-slowdown,pcie-link-width)` when sub-health holds it, `unhealthy (xid-79 (fatal))`),
    then the sub-health reasons where they are not the cause, and the node-wide clock reasons:
    what an operator asks first of a slow card."""
    state = HEALTH_NAMES.get(device.health_state, "unknown")
    cause = device.attributes.get("health_cause", "") if state != "healthy" else ""
    reasons = device.attributes.get(SUBHEALTH_ATTRIBUTE, "")
    node = device.attributes.get(SUBHEALTH_NODE_ATTRIBUTE, "")
    why = [cause] if cause else []
    if reasons and reasons != cause:
        why.append(f"sub-health: {reasons}")
    if node:
        why.append(f"node: {node}")
    return f"{state} ({'; '.join(why)})" if why else state


def _measured(device: pb.Device) -> str:
    """`97%`: FP16 TFLOPS measured on the node at 97% of the profile's (the FP16 column then
    shows the measured figure); `yes` without a profile figure; `-`: the profile's figure."""
    if device.attributes.get("fingerprint") != "measured":
        return "-"
    ratio = device.attributes.get("measured_ratio")
    try:
        return f"{float(ratio):.0%}" if ratio else "yes"
    except ValueError:
        return "yes"


def devices_table(devices: Sequence[pb.Device]) -> str:
    index_of = {d.uuid: f"{d.vendor}/{d.index}" for d in devices}
    rows = []
    for d in devices:
        links = ",".join(
            f"{link.kind}→{index_of.get(link.peer_uuid, _short(link.peer_uuid))}"
            for link in d.links
        )
        rows.append(
            [
                d.vendor,
                str(d.index),
                d.model,
                d.uuid,
                d.pci_bus_id,
                f"{format_bytes(d.vram_allocated_bytes)}/{format_bytes(d.vram_bytes)}",
                format_bytes(max(d.vram_bytes - d.vram_allocated_bytes, 0)),
                _number(d.tflops_fp16),
                _measured(d),
                _health(d),
                str(d.allocation_count),
                links or "-",
            ]
        )
    headers = [
        "VENDOR",
        "IDX",
        "MODEL",
        "UUID",
        "PCI",
        "VRAM USED/TOTAL",
        "FREE",
        "FP16 TFLOPS",
        "MEASURED",
        "HEALTH",
        "ALLOCS",
        "LINKS",
    ]
    return render(headers, rows)


def allocations_table(allocations: Sequence[pb.Allocation], devices: Sequence[pb.Device]) -> str:
    if not allocations:
        return "no allocations\n"
    names = {d.uuid: f"{d.vendor}/{d.index}" for d in devices}
    rows = []
    for a in allocations:
        pod = f"{a.pod.namespace}/{a.pod.name}" if a.pod.name else "-"
        for position, g in enumerate(a.grants):
            first = position == 0
            rows.append(
                [
                    a.container_id if first else "",
                    pod if first else "",
                    (a.container_name or "-") if first else "",
                    names.get(g.device_uuid, g.device_uuid),
                    format_bytes(g.vram_bytes),
                    f"{g.compute_percent}%" if g.compute_percent else "-",
                    a.source if first else "",
                ]
            )
    headers = ["CONTAINER", "POD", "NAME", "DEVICE", "VRAM", "COMPUTE", "SOURCE"]
    return render(headers, rows)


def health_table(devices: Sequence[pb.Device]) -> str:
    rows = [
        [
            d.vendor,
            str(d.index),
            d.uuid,
            d.pci_bus_id,
            str(d.health_score),
            HEALTH_NAMES.get(d.health_state, "unknown"),
        ]
        for d in devices
    ]
    return render(["VENDOR", "IDX", "UUID", "PCI", "SCORE", "STATE"], rows)


def _not_found(notes: Sequence[str]) -> list[str]:
    """Why vendors' backends did not run, one per line under a `not found:` heading."""
    return [f"{'not found:' if i == 0 else '':13}{note}" for i, note in enumerate(notes)]


def _fabric(node: pb.Node) -> str:
    """The node's fabric domain and where it comes from, or why there is none."""
    if not node.fabric_domain:
        return "none"
    return f"{node.fabric_domain} ({node.fabric_source})"


def status_lines(node: pb.Node, devices: Sequence[pb.Device]) -> str:
    total = sum(d.vram_bytes for d in devices)
    used = sum(d.vram_allocated_bytes for d in devices)
    unhealthy = sum(1 for d in devices if d.health_state != pb.HEALTH_STATE_HEALTHY)
    lines = [
        f"node:        {node.name}",
        f"version:     {node.version}",
        f"backends:    {', '.join(node.backends) or '-'}",
        *_not_found(node.discovery_notes),
        f"devices:     {node.device_count} ({unhealthy} not healthy)",
        f"vram:        {format_bytes(used)} allocated of {format_bytes(total)}",
        f"allocations: {node.allocation_count}",
        f"ledger seq:  {node.ledger_seq}",
        f"health:      {node.health_source or 'off'}",
        f"fabric:      {_fabric(node)}",
        *(f"{'':13}{line}" for line in (*node.fabric_ports, *node.fabric_notes)),
    ]
    if node.mode:
        lines.append(f"mode:        {node.mode}")
        ids = [kid or '"" (legacy assignment.key)' for kid in node.assignment_key_ids]
        lines.append(f"keys:        {', '.join(ids) or 'none (assignments are refused)'}")
    if node.orphaned_containers:
        lines.append(f"orphaned:    {', '.join(node.orphaned_containers)} (devices gone)")
    return "\n".join(lines) + "\n"


def measure_table(results: Sequence[pb.MeasureResult], devices: Sequence[pb.Device]) -> str:
    """`hcsctl measure`: one row per device, with the figures or why there are none."""
    names = {d.uuid: f"{d.vendor}/{d.index}" for d in devices}
    rows = [
        [
            names.get(r.uuid, "-"),
            r.uuid,
            r.outcome,
            f"{r.tflops_fp16:.1f}" if r.tflops_fp16 else "-",
            f"{r.ratio:.0%}" if r.ratio else "-",
            f"{r.memory_bandwidth_gbps:.0f}" if r.memory_bandwidth_gbps else "-",
            r.message if r.outcome != "measured" else "",
        ]
        for r in results
    ]
    headers = ["DEVICE", "UUID", "OUTCOME", "FP16 TFLOPS", "OF PROFILE", "GB/S", "WHY"]
    return render(headers, rows)
