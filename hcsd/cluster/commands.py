"""The cluster side's two commands: `hcs-syncer` (one per node) and `hcs-scheduler-extender`."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from hcsd import __version__
from hcsd.cluster.binding import DEFAULT_SCHEDULERS
from hcsd.cluster.dra_slices import TAINT_EFFECTS
from hcsd.cluster.endpoints import (
    Endpoints,
    Settings,
    UsageError,
    add_flags,
    open_endpoints,
    settings_from,
)
from hcsd.cluster.extender import Extender
from hcsd.cluster.httpserver import BoundedServer
from hcsd.cluster.kube import Kube
from hcsd.cluster.kubeletplugin.plugin import KUBELET_DIR, KubeletPlugin, PluginPaths
from hcsd.cluster.leader import LeaderElector
from hcsd.cluster.node_keys import ClusterKeys, NodeKeys, syncer_user
from hcsd.cluster.node_keys_http import serve_node_keys
from hcsd.cluster.profile_gate_controller import ProfileGate
from hcsd.cluster.syncer import SYNCER_TOKEN_FILE, Syncer, SyncerSettings
from hcsd.cluster.tls import TLSSetupError
from hcsd.contract import paths
from hcsd.contract.dra import MODE_DRA, MODE_EXTENDER
from hcsd.contract.keys import AssignmentKeyError
from hcsd.contract.names import LEADER_LEASE, NAMESPACE
from hcsd.profiles.database import ProfileDatabase, ProfileError

__all__ = ["extender_main", "syncer_main"]

log = logging.getLogger("hcs")


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _connect(kubeconfig: str) -> Kube:
    try:
        return Kube.connect(kubeconfig or None)
    except Exception as e:  # the kubernetes package raises several unrelated types
        raise SystemExit(f"cannot load Kubernetes credentials: {e}") from e


def syncer_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hcs-syncer", description="Mirror this node's hcsd into its ComputeNode."
    )
    parser.add_argument("--version", action="version", version=f"hcs-syncer {__version__}")
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME", socket.gethostname()),
        help="the Kubernetes Node name (default: $NODE_NAME, else the hostname)",
    )
    parser.add_argument("--socket", default=paths.SOCKET, help="hcsd's API socket")
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG", ""),
        help="kubeconfig file (default: the pod's service account)",
    )
    parser.add_argument("--namespace", default=NAMESPACE, help="where the heartbeat Lease lives")
    parser.add_argument("--lease-seconds", type=int, default=40)
    parser.add_argument("--renew-seconds", type=float, default=10.0)
    parser.add_argument("--resync-seconds", type=float, default=300.0)
    parser.add_argument(
        "--node-keys-url",
        default="",
        help="the extender's node-keys endpoint (https://…/node-keys): fetch this node's "
        "assignment keys there and install them in hcsd; empty: do not",
    )
    parser.add_argument("--node-keys-ca", default="", help="CA bundle of its serving cert")
    parser.add_argument(
        "--token-file",
        default=SYNCER_TOKEN_FILE,
        help="projected service-account token with audience hcs-node-keys",
    )
    parser.add_argument("--keys-seconds", type=float, default=60.0, help="fetch interval")
    parser.add_argument(
        "--kubelet-plugin",
        action="store_true",
        help="DRA mode: serve kubelet's DRA plugin for driver compute.hcs.io (docs/dra.md)",
    )
    parser.add_argument("--kubelet-dir", default=KUBELET_DIR, help="kubelet's root directory")
    parser.add_argument(
        "--pod-uid",
        default=os.environ.get("POD_UID", ""),
        help="this syncer pod's uid (default: $POD_UID): names the plugin's sockets so that "
        "a new syncer pod registers beside the old one in a rolling update; empty: fixed names",
    )
    parser.add_argument(
        "--mode",
        choices=(MODE_EXTENDER, MODE_DRA),
        default=MODE_EXTENDER,
        help="dra: also publish this node's ResourceSlice, and the extender offers none of its "
        "devices (docs/dra.md)",
    )
    parser.add_argument(
        "--device-taint-effect",
        choices=TAINT_EFFECTS,
        default="NoSchedule",
        help="in dra mode, the effect of the taint on a device hcsd reports unhealthy",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    _logging(args.verbose)
    if not 0 < args.renew_seconds < args.lease_seconds:
        parser.error("--renew-seconds must be positive and below --lease-seconds")
    settings = SyncerSettings(
        node_name=args.node_name,
        socket_path=args.socket,
        namespace=args.namespace,
        lease_seconds=args.lease_seconds,
        renew=args.renew_seconds,
        resync=args.resync_seconds,
        keys_url=args.node_keys_url,
        keys_ca=args.node_keys_ca,
        token_file=args.token_file,
        keys_every=args.keys_seconds,
        mode=args.mode,
        device_taint_effect=args.device_taint_effect,
    )
    syncer = Syncer(settings, _connect(args.kubeconfig))
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: syncer.stop())
    log.info("hcs-syncer %s for node %s (hcsd at %s)", __version__, args.node_name, args.socket)
    plugin = None
    if args.kubelet_plugin:  # its own client: its calls never wait behind the syncer's
        paths_ = PluginPaths.of(args.kubelet_dir, args.pod_uid)
        plugin = KubeletPlugin(_connect(args.kubeconfig), args.socket, paths_, pool=args.node_name)
        plugin.start()
    try:
        syncer.run()
    finally:
        if plugin is not None:
            plugin.stop()
    return 0


def _address(parser: argparse.ArgumentParser, flag: str, text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not (port.isascii() and port.isdigit()):
        parser.error(f"{flag} must be HOST:PORT, got {text!r}")
    return host, int(port)


def _key_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--keys-dir",
        required=True,
        help="the mounted Secret hcs-assignment-key: <kid>.key files and `signing`",
    )
    parser.add_argument(
        "--keys-reload-seconds",
        type=float,
        default=10.0,
        help="how often the Secret's files are read again (a rotation step needs no restart)",
    )
    parser.add_argument(
        "--node-keys-listen",
        default="",
        help="HOST:PORT of the node-keys endpoint for hcs-syncers (HTTPS); empty: off",
    )
    parser.add_argument("--node-keys-cert", default="", help="its TLS serving certificate")
    parser.add_argument("--node-keys-key", default="", help="its TLS private key")
    parser.add_argument(
        "--node-keys-insecure-http",
        action="store_true",
        help="serve node keys over plain HTTP: tests and development ONLY",
    )
    parser.add_argument(
        "--syncer-user",
        default=syncer_user(),
        help="the only user node keys are given to (the syncers' service account)",
    )


def _open_node_keys(
    parser: argparse.ArgumentParser, args: argparse.Namespace, kube: Kube, keys: ClusterKeys
) -> BoundedServer:
    """The node-keys endpoint for hcs-syncers, bound (TLSSetupError: unusable files)."""
    host, port = _address(parser, "--node-keys-listen", args.node_keys_listen)
    return serve_node_keys(
        NodeKeys(kube, keys, user=args.syncer_user),
        host or "0.0.0.0",  # noqa: S104 - an empty host means all
        port,
        cert=args.node_keys_cert,
        key=args.node_keys_key,
        plain_http=args.node_keys_insecure_http,
        reload_seconds=args.tls_reload_seconds,
    )


def _start_node_keys(server: BoundedServer, endpoints: Endpoints, user: str) -> None:
    """Serve it in a thread of its own; its refusals show in the other ports' /metrics."""
    endpoints.count_too(server)
    threading.Thread(target=server.serve_forever, name="node-keys", daemon=True).start()
    log.info("node keys for %s on %s:%d", user, *server.server_address[:2])


def tune_gc() -> None:
    """Keep the garbage collector off the caches: thousands of NodeViews are long-lived, and
    a full collection walking them costs hundreds of milliseconds in the middle of a filter
    call. Freeze what exists (the synced caches) and collect young objects less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 1000)


def _serving(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Settings | None:
    """The ports' settings, or None after saying why the TLS files cannot be used."""
    if args.node_keys_listen and not (args.node_keys_cert or args.node_keys_insecure_http):
        parser.error("--node-keys-listen needs --node-keys-cert (or --node-keys-insecure-http)")
    try:
        return settings_from(args)
    except UsageError as e:
        parser.error(str(e))
    except TLSSetupError as e:
        print(f"hcs-scheduler-extender: {e}", file=sys.stderr)
        return None


def _extender_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hcs-scheduler-extender",
        description="kube-scheduler extender for ai.compute/* resources.",
    )
    parser.add_argument(
        "--version", action="version", version=f"hcs-scheduler-extender {__version__}"
    )
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", ""))
    _key_arguments(parser)
    parser.add_argument("--profiles", default="", help="profile database (default: built in)")
    parser.add_argument("--namespace", default=NAMESPACE)
    parser.add_argument(
        "--leader-elect",
        action="store_true",
        help="run several replicas: only the Lease holder binds and is ready",
    )
    parser.add_argument("--identity", default=os.environ.get("POD_NAME", socket.gethostname()))
    parser.add_argument(
        "--scheduler-name",
        action="append",
        default=[],
        help="bind only pods of this spec.schedulerName (repeat; default: default-scheduler)",
    )
    parser.add_argument("--quota-status-seconds", type=float, default=5.0)
    parser.add_argument(
        "--count-claims",
        action="store_true",
        help="DRA mode: count the allocated ResourceClaims of compute.hcs.io devices in "
        "ComputeQuota usage (needs list and watch of resourceclaims)",
    )
    parser.add_argument(
        "--profile-gate",
        action="store_true",
        help="DRA mode: release pods gated for their RuntimeProfile once their images are set "
        "for the vendor chosen (hcsd/cluster/profile_gate_controller.py)",
    )
    parser.add_argument("--profile-gate-seconds", type=float, default=2.0)
    parser.add_argument(
        "--no-requeue",
        dest="requeue",
        action="store_false",
        help="never touch refused pods (the chart's requeue.enabled=false: no `patch pods`)",
    )
    parser.add_argument(
        "--no-runtime-profiles",
        dest="runtime_profiles",
        action="store_false",
        help="never list RuntimeProfiles; refuse pods naming one (the chart's "
        "runtimeProfiles.enabled=false: no RBAC on runtimeprofiles)",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    add_flags(parser)
    return parser


def _own_pod() -> tuple[str, str] | None:
    """The extender's pod (the downward API's POD_NAMESPACE, POD_NAME): what the requeue
    guard asks about; None outside a pod (it asks about a refused pod instead)."""
    namespace, name = os.environ.get("POD_NAMESPACE", ""), os.environ.get("POD_NAME", "")
    return (namespace, name) if namespace and name else None


def extender_main(argv: Sequence[str] | None = None) -> int:
    parser = _extender_parser()
    args = parser.parse_args(argv)
    _logging(args.verbose)
    serving = _serving(args, parser)
    if serving is None:
        return 2
    try:
        keys = ClusterKeys(args.keys_dir, every=args.keys_reload_seconds)
        db = ProfileDatabase.load(Path(args.profiles) if args.profiles else None)
    except (AssignmentKeyError, ProfileError, OSError) as e:
        print(f"hcs-scheduler-extender: {e}", file=sys.stderr)
        return 2
    kube = _connect(args.kubeconfig)
    elector = None
    if args.leader_elect:
        elector = LeaderElector(kube, args.namespace, LEADER_LEASE, args.identity).start()
    extender = Extender(
        kube,
        keys,
        db,
        namespace=args.namespace,
        is_leader=elector.is_leader if elector else (lambda: True),
        schedulers=frozenset(args.scheduler_name) or DEFAULT_SCHEDULERS,
        requeue=args.requeue,
        own_pod=_own_pod(),
        claims=args.count_claims,
        runtime_profiles=args.runtime_profiles,
    )
    try:
        node_keys = _open_node_keys(parser, args, kube, keys) if args.node_keys_listen else None
    except TLSSetupError as e:
        print(f"hcs-scheduler-extender: node-keys port: {e}", file=sys.stderr)
        return 2
    endpoints = open_endpoints(extender, serving)
    if node_keys is not None:
        _start_node_keys(node_keys, endpoints, args.syncer_user)
    extender.start()
    stopping = threading.Event()

    def stop(*_: object) -> None:
        stopping.set()
        threading.Thread(target=endpoints.shutdown, daemon=True).start()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)

    def caches() -> None:
        if extender.state.wait_synced(timeout=300):
            extender.state.snapshot()  # every node's first snapshot, before the first filter
            tune_gc()
            endpoints.set_ready()
            log.info("caches synced: %d ComputeNode(s)", extender.state.counts()[0])
        extender.quota_status.run(stopping, args.quota_status_seconds, extender.is_leader)

    threading.Thread(target=caches, name="caches", daemon=True).start()
    if args.profile_gate:
        gate = ProfileGate(kube, db, watch=True)
        threading.Thread(
            target=gate.run,
            args=(stopping, args.profile_gate_seconds, extender.is_leader),
            name="profile-gate",
            daemon=True,
        ).start()
    for server in endpoints.servers:
        log.info(
            "hcs-scheduler-extender %s: %s on %s:%d",
            __version__,
            server.name,
            *server.server_address[:2],
        )
    endpoints.serve_forever()
    extender.stop()
    if elector is not None:
        elector.step_down()  # a bind that starts now is refused
        if endpoints.wait_idle(timeout=5.0):  # binds in progress: the leader's writes
            elector.release()  # the next replica binds at once, not after the Lease expires
        else:
            log.warning("requests still in progress; Lease left to expire")
    return 0
