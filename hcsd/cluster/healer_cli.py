"""`hcs-controller`: the isolation controller (hcsd/cluster/healer.py), leader-elected.

Replicas elect a leader on the Lease `hcs-controller`; only the leader acts, the others keep
their caches warm. On SIGTERM the leader waits (five seconds at most) for its round in
progress, then gives the Lease back, so a standby (or a rolling update's new replica) takes
over at once rather than after `--lease-seconds`; a round still running then leaves the Lease
to expire, so that two replicas never act at once. One plain-HTTP
port serves /healthz (alive), /readyz (caches synced) and /metrics for the kubelet and
Prometheus. `python -m hcsd.cluster.healer_cli` runs it without
the installed entry point.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hcsd import __version__
from hcsd.cluster.healer import Healer, Timing
from hcsd.cluster.healer_fleet import FleetPolicy
from hcsd.cluster.healer_limits import Limits
from hcsd.cluster.healer_policy import TAINT_EFFECTS, Policy
from hcsd.cluster.httpserver import BoundedHandler, BoundedServer
from hcsd.cluster.kube import Kube
from hcsd.cluster.leader import LeaderElector
from hcsd.contract.names import CONTROLLER_LEASE, NAMESPACE
from hcsd.profiles.database import ProfileDatabase, ProfileError

__all__ = ["main"]

log = logging.getLogger("hcs")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hcs-controller",
        description="Isolate failed accelerators: evict their pods, taint dead nodes, "
        "mark devices slow against the fleet.",
    )
    p.add_argument("--version", action="version", version=f"hcs-controller {__version__}")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", ""))
    p.add_argument("--namespace", default=NAMESPACE, help="where the leader Lease lives")
    p.add_argument("--identity", default=os.environ.get("POD_NAME", socket.gethostname()))
    p.add_argument("--lease-seconds", type=float, default=15.0)
    p.add_argument("--renew-seconds", type=float, default=5.0)
    p.add_argument("--probe-listen", default="0.0.0.0:8891", help="/healthz, /readyz, /metrics")
    p.add_argument("--profiles", default="", help="profile database (default: built in)")
    p.add_argument(
        "--interval-seconds", type=float, default=5.0, help="a round at least this often"
    )
    p.add_argument(
        "--eviction-grace-seconds",
        type=int,
        default=-1,
        help="the evicted pods' grace period (default -1: each pod's own)",
    )
    p.add_argument(
        "--backoff-seconds", type=float, default=2.0, help="first retry of a blocked eviction"
    )
    p.add_argument("--backoff-max-seconds", type=float, default=120.0)
    p.add_argument(
        "--taint-share",
        type=float,
        default=1.0,
        help="taint a Node when more than this share of its devices are bad (1: all)",
    )
    p.add_argument("--taint-effect", choices=TAINT_EFFECTS, default="NoSchedule")
    p.add_argument(
        "--quiet-seconds",
        type=float,
        default=300.0,
        help="a Node's devices good this long before its taint goes",
    )
    p.add_argument(
        "--isolate-degraded",
        action="store_true",
        help="treat degraded and slow devices as failed ones (evict, count towards the taint)",
    )
    p.add_argument(
        "--slow-margin",
        type=float,
        default=0.15,
        help="slow: efficiency below the model's fleet median by more than this share",
    )
    p.add_argument("--slow-min-devices", type=int, default=3)
    p.add_argument(
        "--evictions-per-minute",
        type=float,
        default=10.0,
        help="at most this many evictions a minute (a minute's worth at once)",
    )
    p.add_argument(
        "--breaker-share",
        type=float,
        default=0.5,
        help="evict and taint nothing while more than this share of the nodes or devices "
        "with accelerators is bad (1: never stop)",
    )
    p.add_argument(
        "--min-bad-seconds",
        type=float,
        default=10.0,
        help="a device reported bad this long before anything is done about it",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="log and count what would be done; write nothing"
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _probes(healer: Healer, address: str) -> BoundedServer:
    host, _, port = address.rpartition(":")

    class Handler(BoundedHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                status, kind, body = (
                    200,
                    CONTENT_TYPE_LATEST,
                    generate_latest(healer.metrics.registry),
                )
            elif path == "/healthz":
                status, kind, body = 200, "text/plain", b"ok\n"
            elif path == "/readyz":
                ready = healer.synced()
                status, kind = (200 if ready else 503), "text/plain"
                body = b"ok\n" if ready else b"caches not synced\n"
            else:
                status, kind, body = 404, "text/plain", b"not found\n"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    return BoundedServer((host or "0.0.0.0", int(port)), Handler, name="probes")  # noqa: S104


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        policy = Policy(
            taint_share=args.taint_share,
            taint_effect=args.taint_effect,
            quiet_seconds=args.quiet_seconds,
            grace_seconds=None if args.eviction_grace_seconds < 0 else args.eviction_grace_seconds,
            isolate_degraded=args.isolate_degraded,
        )
        limits = Limits(
            evictions_per_minute=args.evictions_per_minute,
            breaker_share=args.breaker_share,
            min_bad_seconds=args.min_bad_seconds,
            dry_run=args.dry_run,
        )
        db = ProfileDatabase.load(Path(args.profiles) if args.profiles else None)
    except (ValueError, ProfileError, OSError) as e:
        print(f"hcs-controller: {e}", file=sys.stderr)
        return 2
    try:
        kube = Kube.connect(args.kubeconfig or None)
    except Exception as e:  # the kubernetes package raises several unrelated types
        print(f"hcs-controller: cannot load Kubernetes credentials: {e}", file=sys.stderr)
        return 2
    elector = LeaderElector(
        kube,
        args.namespace,
        CONTROLLER_LEASE,
        args.identity,
        duration=args.lease_seconds,
        renew=args.renew_seconds,
    ).start()
    healer = Healer(
        kube,
        db,
        policy=policy,
        fleet=FleetPolicy(margin=args.slow_margin, min_devices=args.slow_min_devices),
        timing=Timing(args.interval_seconds, args.backoff_seconds, args.backoff_max_seconds),
        limits=limits,
        is_leader=elector.is_leader,
    ).start()
    server = _probes(healer, args.probe_listen)

    def stop(*_: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    log.info(
        "hcs-controller %s as %s: probes on %s:%d",
        __version__,
        args.identity,
        *server.server_address[:2],
    )
    server.serve_forever()
    if healer.stop(timeout=5.0):
        elector.release()  # a rolling update's new replica leads now, not after the Lease expires
    else:  # a round may still act: the Lease expires instead, and no one acts beside it
        elector.stop()
        log.warning("Lease %s not given back (a round still runs); it expires in %.0fs",
                    CONTROLLER_LEASE, elector.duration)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
