"""`hcsctl convert`: how many devices of each model meet a need, and exchange rates.

Works from the profile database alone, so it needs no running hcsd: a user can size a request
before any node exists. `--json` prints the same answer as data.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hcsd.profiles import ProfileDatabase, ProfileError, default_database
from hcsd.profiles.exchange import Conversion, ConversionError, convert, parse_need
from hcsd.quantity import format_bytes

__all__ = ["add_parser", "run"]

_UNITS = {
    "tflops_fp16": "TFLOPS",
    "tflops_bf16": "TFLOPS",
    "tflops_fp32": "TFLOPS",
    "tops_int8": "TOPS",
    "vram_bytes": "",
    "acu": "TFLOPS",
}


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "convert",
        help="devices of each model that meet a need, and exchange rates (no daemon needed)",
        description="Examples: '100 TFLOPS fp16', '400 TOPS int8', 'vram 160Gi', '500 ACU', "
        "'8 nvidia/A100-80G' (that many devices of a model, by FP16).",
    )
    parser.add_argument("need", help="what is needed, e.g. '100 TFLOPS fp16' or 'vram 160Gi'")
    parser.add_argument("--to", metavar="VENDOR/MODEL", help="only these models (prefix: 910B)")
    parser.add_argument("--profiles", metavar="PATH", help="profile database (default: shipped)")
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")


def run(args: argparse.Namespace) -> int:
    try:
        db = ProfileDatabase.load(Path(args.profiles)) if args.profiles else default_database()
        result = convert(parse_need(args.need, db), db, to=args.to)
    except (ConversionError, ProfileError, ValueError) as e:
        print(f"hcsctl: {e}", file=sys.stderr)
        return 2
    if getattr(args, "json", False):
        json.dump(as_data(result, db), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(as_text(result, db))
    return 0


def as_data(result: Conversion, db: ProfileDatabase) -> dict[str, Any]:
    need = result.need
    return {
        "need": {
            "text": need.text,
            "figure": need.figure,
            "amount": need.amount,
            "model": need.model.key if need.model else None,
        },
        "acu": {"tflops_fp16": db.acu_tflops, "reference": db.reference.key},
        "options": [
            {
                "model": o.profile.key,
                "per_device": o.per_device,
                "devices": o.devices,
                "acu_per_device": round(o.acu_per_device, 2),
                "confidence": o.profile.confidence,
                "source": o.profile.source,
            }
            for o in result.options
        ],
        "skipped": [{"model": p.key, "reason": reason} for p, reason in result.skipped],
        "rates": [
            {"from": r.source.key, "to": r.target.key, "figure": r.figure, "rate": round(r.rate, 4)}
            for r in result.rates
        ],
    }


def as_text(result: Conversion, db: ProfileDatabase) -> str:
    need = result.need
    unit = _UNITS[need.figure]
    lines = [
        f"need: {need.text}  (1 ACU = {db.acu_tflops:g} TFLOPS FP16, 1% of an {db.reference.model})"
    ]
    lines.append(f"{'MODEL':<30} {'PER DEVICE':>16} {'DEVICES':>8} {'ACU/DEVICE':>11}  CONFIDENCE")
    for o in result.options:
        per = (
            format_bytes(int(o.per_device))
            if need.figure == "vram_bytes"
            else (f"{o.per_device:g} {unit}")
        )
        lines.append(
            f"{o.profile.key:<30} {per:>16} {o.devices:>8} {o.acu_per_device:>11.1f}"
            f"  {o.profile.confidence}"
        )
    for profile, reason in result.skipped:
        lines.append(f"skipped {profile.key}: {reason}")
    for rate in result.rates:
        lines.append(
            f"rate: 1 {rate.source.key} = {rate.rate:.3g} {rate.target.key} (by {rate.figure})"
        )
    return "\n".join(lines) + "\n"
