"""`hcsctl`: look at and change what hcsd holds.

Readable tables by default, `--json` for scripts. Every failure is one line on stderr starting
with `hcsctl: ` and a non-zero exit: 1 when hcsd refused or could not be reached, 2 for usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict

from hcsd.api.client import ApiError, Client
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cli import cluster, convert, setup, tables
from hcsd.contract import paths

__all__ = ["main"]

DEFAULT_SOCKET = paths.SOCKET


def _as_json(message: Any) -> Any:
    return MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    if args.json:
        json.dump(data, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(text)


def cmd_devices(client: Client, args: argparse.Namespace) -> None:
    devices = client.devices()
    _emit(args, [_as_json(d) for d in devices], tables.devices_table(devices))


def cmd_allocations(client: Client, args: argparse.Namespace) -> None:
    allocations = client.allocations()
    text = "" if args.json else tables.allocations_table(allocations, client.devices())
    _emit(args, [_as_json(a) for a in allocations], text)


def cmd_health(client: Client, args: argparse.Namespace) -> None:
    devices = client.devices()
    data = [
        {
            "uuid": d.uuid,
            "vendor": d.vendor,
            "index": d.index,
            "health_score": d.health_score,
            "health_state": pb.HealthState.Name(d.health_state),
        }
        for d in devices
    ]
    _emit(args, data, tables.health_table(devices))


def cmd_status(client: Client, args: argparse.Namespace) -> None:
    node = client.node()
    devices = client.devices()
    _emit(args, _as_json(node), tables.status_lines(node, devices))


def cmd_measure(client: Client, args: argparse.Namespace) -> None:
    results = client.measure(args.device or [], timeout=args.wait)
    text = "" if args.json else tables.measure_table(results, client.devices())
    _emit(args, [_as_json(r) for r in results], text)
    if any(r.outcome in ("failed", "aborted") for r in results):
        raise MeasureFailed()


def cmd_allocate(client: Client, args: argparse.Namespace) -> None:
    namespace, _, name = (args.pod or "").rpartition("/")
    if args.pod and (not namespace or not name):
        raise UsageError("--pod must be NAMESPACE/NAME")
    request = pb.AllocateRequest(
        container_id=args.container,
        pod=pb.PodRef(namespace=namespace, name=name, uid=args.pod_uid or ""),
        container_name=args.container_name or "",
        vram=args.vram or "",
        tflops_fp16=args.tflops_fp16 or "",
        devices=args.devices or 0,
        compute_percent=args.compute or 0,
        vendors=args.vendor or [],
        models=args.model or [],
        policy=args.policy or "",
        topology=args.topology or "",
    )
    response = client.allocate(request)
    verb = "allocated" if response.created else "already held"
    text = f"{verb} ({response.model}):\n" + tables.allocations_table(
        [response.allocation], client.devices()
    )
    _emit(args, _as_json(response), text)


def cmd_release(client: Client, args: argparse.Namespace) -> None:
    response = client.release(args.container)
    text = (
        f"released {args.container}\n"
        if response.released
        else f"{args.container} held nothing; nothing to release\n"
    )
    _emit(args, _as_json(response), text)


class UsageError(Exception):
    pass


class MeasureFailed(Exception):
    """A device's measurement failed or was aborted (the table says why): exit 1."""


def _compute(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError("must be 0..100")
    return value


def _devices(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hcsctl", description="Inspect and change device allocations held by hcsd."
    )
    parser.add_argument(
        "--socket",
        default=os.environ.get("HCS_SOCKET", DEFAULT_SOCKET),
        help=f"hcsd API socket (default: $HCS_SOCKET or {DEFAULT_SOCKET})",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for hcsd")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    commands.add_parser("devices", help="devices with fingerprint, usage and health")
    commands.add_parser("allocations", help="which container holds which slice")
    commands.add_parser("health", help="health score and state per device")
    commands.add_parser("status", help="node summary")

    allocate = commands.add_parser("allocate", help="allocate device slices to a container")
    allocate.add_argument("--container", required=True, help="container id (the identity)")
    allocate.add_argument("--vram", help="VRAM per device, e.g. 16Gi (default: whole devices)")
    allocate.add_argument("--devices", type=_devices, help="number of devices (default 1)")
    allocate.add_argument("--tflops-fp16", help="total FP16 TFLOPS wanted, e.g. 100")
    allocate.add_argument("--compute", type=_compute, help="reserved compute share, percent")
    allocate.add_argument("--vendor", action="append", help="allowed vendor (repeatable)")
    allocate.add_argument("--model", action="append", help="allowed model (repeatable)")
    allocate.add_argument("--policy", choices=["binpack", "spread"])
    allocate.add_argument("--topology", choices=["high-bandwidth"])
    allocate.add_argument("--pod", help="NAMESPACE/NAME of the pod, for the record")
    allocate.add_argument("--pod-uid")
    allocate.add_argument("--container-name")

    measure = commands.add_parser(
        "measure",
        help="measure devices now (dense FP16 GEMM through the vendor's math library)",
        description="Measure the devices named (all when none) one after the other; a device "
        "holding an allocation is skipped. Exit 1 when a measurement failed or was aborted.",
    )
    measure.add_argument("device", nargs="*", help="device uuid (default: every device)")
    measure.add_argument(
        "--wait", type=float, default=600.0, help="seconds to wait for the pass (default 600)"
    )

    release = commands.add_parser("release", help="release a container's allocation")
    release.add_argument("container", help="container id")
    setup.add_parser(commands)
    convert.add_parser(commands)
    cluster.add_parser(commands)
    return parser


COMMANDS = {
    "devices": cmd_devices,
    "allocations": cmd_allocations,
    "health": cmd_health,
    "status": cmd_status,
    "allocate": cmd_allocate,
    "release": cmd_release,
    "measure": cmd_measure,
}

# Commands that work without a running hcsd: setup (the runtime's configuration), convert (the
# profile database alone), cluster (the API server).
WITHOUT_HCSD: dict[str, Callable[[argparse.Namespace], int]] = {
    "setup": setup.run,
    "convert": convert.run,
    "cluster": cluster.run,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    without_hcsd = WITHOUT_HCSD.get(args.command)
    if without_hcsd is not None:
        return without_hcsd(args)
    try:
        with Client(args.socket, timeout=args.timeout) as client:
            COMMANDS[args.command](client, args)
    except ApiError as e:
        print(f"hcsctl: {e}", file=sys.stderr)
        return 1
    except UsageError as e:
        print(f"hcsctl: {e}", file=sys.stderr)
        return 2
    except MeasureFailed:
        return 1
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
