"""`hcsctl cluster` as text and as JSON: both from one ClusterView, tested on data alone.

The JSON is a documented interface (docs/cluster.md, "The cluster view"): `version` changes
when a field is removed or changes meaning; new fields may appear within a version.

Every string in the text comes from objects other people wrote (a device's reason, a pod's
message, names): each non-printable character is shown escaped (`\n`, `\x1b`, `\u202e`) so
none can move the cursor, recolour the terminal or fake a line of the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from hcsd.cli.tables import render as _render_plain
from hcsd.cluster.cluster_view import ClusterView, ModelSummary, Source, StaleNode, totals
from hcsd.quantity import format_bytes

__all__ = ["JSON_VERSION", "view_json", "view_text"]

JSON_VERSION = 1


def _acu(value: float) -> str:
    """One decimal, a trailing `.0` dropped; never exponent notation (1000137.5, not
    1.00014e+06)."""
    text = f"{value:.1f}"
    return "0" if text == "-0.0" else text.removesuffix(".0")


def escape(text: str) -> str:
    """`text` safe to print: control and format characters (C0, DEL, C1, newlines, bidi
    overrides) and line separators as escapes; printable text as it is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def render(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return _render_plain(headers, [[escape(cell) for cell in row] for row in rows])


def _bytes(value: int) -> str:
    return format_bytes(value) if value else "0"


def _age(created: str, now: float) -> str:
    """kubectl's short age: 45s, 12m, 3h, 5d."""
    try:
        seconds = max(0, int(now - datetime.fromisoformat(created).timestamp()))
    except ValueError:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _summary_lines(view: ClusterView, source: Source, acu_tflops: float) -> list[str]:
    all_ = totals(view.models)
    phases: dict[str, int] = {}
    for phase in view.nodes.values():
        phases[phase] = phases.get(phase, 0) + 1
    counts = ", ".join(f"{n} {p}" for p, n in sorted(phases.items()))
    context = f" (context {source.context})" if source.context else ""
    unusable = ""
    if all_.unusable:
        unusable = (
            f", {all_.unusable} unusable: {_bytes(all_.unusable_vram)} VRAM and "
            f"{_acu(all_.unusable_acu)} ACU in the totals, not in free"
        )
    lines = [
        f"cluster:  {source.server}{context}",
        f"nodes:    {len(view.nodes)}" + (f" ({counts})" if counts else ""),
        f"devices:  {all_.devices} ({all_.not_healthy} not healthy{unusable})",
        f"vram:     {_bytes(all_.vram_used)} allocated of {_bytes(all_.vram_total)} "
        f"({_bytes(all_.vram_free)} free)",
        f"acu:      {_acu(all_.acu_used)} reserved of {_acu(all_.acu_total)} "
        f"({_acu(all_.acu_free)} free; {all_.acu_source}; 1 ACU = {acu_tflops:g} FP16 TFLOPS)",
    ]
    if view.stale:
        stale = totals([n.capacity for n in view.stale])
        lines.append(
            f"stale:    {len(view.stale)} nodes, {stale.devices} devices, "
            f"{_bytes(stale.vram_total)} VRAM, {_acu(stale.acu_total)} ACU: not counted above "
            "(the scheduler does not use them)"
        )
    if view.heartbeats_missing:
        lines.append(f"stale:    not checked ({view.heartbeats_missing})")
    return [escape(line) for line in lines]


def _stale_table(stale: Sequence[StaleNode]) -> str:
    rows = [
        [n.name, str(n.capacity.devices), _bytes(n.capacity.vram_total),
         _acu(n.capacity.acu_total), n.reason]
        for n in stale
    ]  # fmt: skip
    return "stale nodes:\n" + render(["NODE", "DEVICES", "VRAM", "ACU", "REASON"], rows)


def _models_table(models: Sequence[ModelSummary]) -> str:
    rows = [
        [
            m.vendor,
            m.model,
            str(len(m.nodes)),
            str(m.devices),
            str(m.not_healthy),
            str(m.unusable),
            f"{_bytes(m.vram_used)}/{_bytes(m.vram_total)}",
            _bytes(m.vram_free),
            f"{_acu(m.acu_used)}/{_acu(m.acu_total)}",
            m.acu_source,
        ]
        for m in models
    ]
    headers = [
        "VENDOR",
        "MODEL",
        "NODES",
        "DEVICES",
        "NOT HEALTHY",
        "UNUSABLE",
        "VRAM USED/TOTAL",
        "FREE",
        "ACU USED/TOTAL",
        "ACU FROM",
    ]
    return render(headers, rows)


def view_text(view: ClusterView, source: Source, acu_tflops: float, now: float) -> str:
    parts = ["\n".join(_summary_lines(view, source, acu_tflops)) + "\n"]
    parts.append(_models_table(view.models) if view.models else "no live ComputeNodes\n")
    if view.stale:
        parts.append(_stale_table(view.stale))
    if view.sick:
        rows = [
            [d.node, f"{d.vendor}/{d.index}", d.model, d.health, str(d.score), d.uuid,
             d.reason or "-"]
            for d in view.sick
        ]  # fmt: skip
        parts.append(
            "not healthy:\n"
            + render(["NODE", "DEVICE", "MODEL", "STATE", "SCORE", "UUID", "REASON"], rows)
        )
    if view.pending:
        rows = [
            [p.namespace, p.name, ",".join(f"{k}={v}" for k, v in p.asks.items()) or "-",
             p.scheduler, p.node or "-", _age(p.created, now), f"{p.reason}: {p.message}"]
            for p in view.pending
        ]  # fmt: skip
        headers = ["NAMESPACE", "POD", "ASKS", "SCHEDULER", "NODE", "AGE", "REASON"]
        parts.append("pending accelerator pods:\n" + render(headers, rows))
    elif view.pods_missing:
        parts.append(f"pending accelerator pods: not shown ({view.pods_missing})\n")
    else:
        parts.append("pending accelerator pods: none\n")
    if view.quotas:
        keys = ("vram", "tflops-fp16", "devices")
        rows = [
            [q.namespace, q.name]
            + [f"{q.used.get(k, '-')}/{q.hard[k]}" if k in q.hard else "-" for k in keys]
            for q in view.quotas
        ]
        headers = ["NAMESPACE", "NAME", "VRAM USED/HARD", "TFLOPS-FP16 USED/HARD",
                   "DEVICES USED/HARD"]  # fmt: skip
        parts.append("ComputeQuotas:\n" + render(headers, rows))
    for problem in view.problems:
        parts.append(f"left out: {escape(problem)}\n")
    return "\n".join(parts)


def _model_json(m: ModelSummary) -> dict[str, Any]:
    return {
        "nodes": sorted(m.nodes),
        "devices": m.devices,
        "not_healthy": m.not_healthy,
        "vram_total_bytes": m.vram_total,
        "vram_used_bytes": m.vram_used,
        "vram_free_bytes": m.vram_free,
        "acu_total": round(m.acu_total, 1),
        "acu_used": round(m.acu_used, 1),
        "acu_free": round(m.acu_free, 1),
        "unusable_devices": m.unusable,
        "unusable_vram_bytes": m.unusable_vram,
        "unusable_acu": round(m.unusable_acu, 1),
        "acu_source": m.acu_source,
        "measured_devices": m.measured,
    }


def view_json(view: ClusterView, source: Source, acu_tflops: float) -> dict[str, Any]:
    return {
        "version": JSON_VERSION,
        "source": {
            "server": source.server,
            "kubeconfig": source.kubeconfig,
            "context": source.context,
        },
        "acu_tflops_fp16": acu_tflops,
        "nodes": dict(sorted(view.nodes.items())),
        "totals": _model_json(totals(view.models)),
        "models": [{"vendor": m.vendor, "model": m.model, **_model_json(m)} for m in view.models],
        "stale_nodes": [
            {"node": n.name, "reason": n.reason, **_model_json(n.capacity)} for n in view.stale
        ],
        "stale_totals": _model_json(totals([n.capacity for n in view.stale])),
        "heartbeats_checked": view.heartbeats_read,
        "pending_pods_shown": not view.pods_missing,
        "pending_pods_namespace": view.namespace,
        "not_healthy_devices": [
            {
                "node": d.node,
                "uuid": d.uuid,
                "vendor": d.vendor,
                "index": d.index,
                "model": d.model,
                "health": d.health,
                "health_score": d.score,
                "reason": d.reason,
            }
            for d in view.sick
        ],
        "pending_pods": [
            {
                "namespace": p.namespace,
                "name": p.name,
                "asks": dict(p.asks),
                "scheduler": p.scheduler,
                "node": p.node,
                "reason": p.reason,
                "message": p.message,
                "created": p.created,
            }
            for p in view.pending
        ],
        "quotas": [
            {"namespace": q.namespace, "name": q.name, "hard": dict(q.hard), "used": dict(q.used)}
            for q in view.quotas
        ],
        "problems": list(view.problems),
    }
