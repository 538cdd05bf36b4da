"""`hcsd`: the node daemon's entry point and its life cycle.

Start: config → discovery → ledger replay → API socket → metrics → READY=1.
SIGTERM/SIGINT: STOPPING=1, stop taking calls, let calls in flight finish (shutdown_grace),
close the ledger, exit 0. SIGHUP: re-read the config and apply the keys marked reloadable; a
bad file is reported and the running config kept.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace

from hcsd import __version__
from hcsd.api.server import ApiServer, SocketInUse
from hcsd.contract.keyring_files import KeyringFile
from hcsd.contract.keys import AssignmentKeyError
from hcsd.daemon import notify
from hcsd.daemon.config import DEFAULT_PATH, Config, ConfigError, load_config
from hcsd.daemon.devicecheck import open_device_nodes
from hcsd.daemon.discovering import build_backends, hotplug_watcher, plan
from hcsd.daemon.fabric_watch import fabric_at_start, watch_fabric
from hcsd.daemon.logs import configure_logging, set_level
from hcsd.daemon.measuring import Measurer, build_measurer
from hcsd.daemon.metrics import MetricsServer
from hcsd.daemon.reference import render_default_config
from hcsd.daemon.vram import vram_watchdog
from hcsd.discovery import DiscoveryBackend, DiscoveryError, Inventory, discover_all
from hcsd.health.watching import HealthWatcher
from hcsd.health.watching import wanted as watching_wanted
from hcsd.ledger import Ledger, LedgerError
from hcsd.runtime.cdi import keep_spec_current, publish_spec
from hcsd.runtime.edits import ContainerEdits
from hcsd.runtime.injector import Injector, InjectorSettings
from hcsd.runtime.nri.plugin import NriPlugin
from hcsd.sections import merge_reloadable
from hcsd.service import NodeService
from hcsd.tasks import run_tasks, supervise
from hcsd.telemetry import Telemetry
from hcsd.watchdog import Watchdog

__all__ = ["RELOAD_STEPS", "main"]

log = logging.getLogger("hcsd")


class StartupError(Exception):
    """hcsd cannot start; the message is the one line the operator needs."""


class Daemon:
    def __init__(self, config: Config, config_path: str | None) -> None:
        self.config = config
        self.config_path = config_path
        self.stopping = asyncio.Event()
        self.service: NodeService | None = None
        self.backends: list[DiscoveryBackend] = []
        self._cdi_preload: ContainerEdits | None = None  # libhcs in every CDI spec entry
        self.injector: Injector | None = None
        self.measurer: Measurer | None = None
        self.telemetry = Telemetry()

    def _open_state(self) -> tuple[Inventory, Ledger]:
        """Discovery and ledger replay: what must work before anything is served."""
        config = self.config
        chosen = plan(config.discovery)
        self.backends = build_backends(config.discovery, chosen)
        try:
            inventory = discover_all(config.node.resolved_name(), self.backends, chosen.notes)
        except DiscoveryError as e:
            raise StartupError(f"failed to discover devices: {e}") from e
        inventory = replace(inventory, fabric=fabric_at_start(config.discovery))
        ledger = Ledger(config.daemon.state_dir, config.ledger)
        try:
            report = ledger.open()
        except (LedgerError, OSError) as e:
            raise StartupError(f"failed to open the ledger: {e}") from e
        log.info(
            "ledger %s: %d allocation(s), %d record(s) replayed after snapshot %d%s",
            config.daemon.state_dir,
            report.allocations,
            report.records,
            report.snapshot_seq,
            f", {report.torn_bytes} torn byte(s) dropped" if report.torn_bytes else "",
        )
        return inventory, ledger

    async def run(self) -> None:
        config = self.config
        inventory, ledger = self._open_state()
        service = NodeService(inventory, ledger, allocator=config.allocator, version=__version__)
        self.service = service
        for orphan in ledger.orphans():
            log.warning(
                "%s: holds device(s) this node no longer has: %s",
                orphan.container_id,
                ", ".join(orphan.device_uuids),
            )
        watcher = (
            None
            if not watching_wanted(config.health)
            else HealthWatcher(
                service,
                config.health,
                backends=self.backends,
                sysfs=config.discovery.sysfs,
                run_dir=config.daemon.run_dir,
            )
        )
        injector = self._injector(service)
        measurer = self._measurer(service)
        vram = vram_watchdog(
            config.watchdog,
            config.discovery,
            service,
            config.daemon.run_dir,
            injector.claim_links.members,
        )
        api = ApiServer(
            service, config.daemon.socket, injector, self.telemetry, measure=measurer.measure
        )
        metrics = (
            MetricsServer(service, config.metrics, watcher, vram, self.telemetry)
            if config.metrics.listen
            else None
        )
        try:
            try:
                await api.start()
            except (SocketInUse, RuntimeError, OSError) as e:
                raise StartupError(f"failed to serve the API on {config.daemon.socket}: {e}") from e
            if metrics is not None:
                try:
                    await metrics.start()
                except OSError as e:
                    raise StartupError(
                        f"failed to serve metrics on {config.metrics.listen}: {e}"
                    ) from e
            self._install_signals()
            if watcher is not None:
                service.set_health_source(watcher.start(asyncio.get_running_loop()))
            log.info(
                "hcsd %s ready on node %s: %d device(s) from %s",
                __version__,
                inventory.node_name,
                len(inventory.devices),
                ", ".join(inventory.backends) or "no backend (no accelerator found)",
            )
            # Everything built so far (modules, grpc, protobuf descriptors, inventory) lives as
            # long as the process: keep it out of every later collection, which would otherwise
            # rescan it and show up as millisecond stalls in the API's tail latency.
            gc.freeze()
            notify.ready(self._status())
            await run_tasks(self._tasks(service, watcher, injector, vram), grace=1.0)
            log.info("stopping: draining API calls (up to %.1fs)", config.daemon.shutdown_grace)
            notify.stopping()
        finally:
            await api.stop(config.daemon.shutdown_grace)
            if metrics is not None:
                await metrics.stop()
            ledger.close()
            self._close_sources(vram)
        log.info("hcsd stopped")

    def _close_sources(self, vram: Watchdog | None) -> None:
        """Vendor library handles: the watchdog's readers, then the discovery backends."""
        if vram is not None:
            vram.close()
        for backend in self.backends:
            backend.close()

    def _tasks(
        self,
        service: NodeService,
        watcher: HealthWatcher | None,
        injector: Injector,
        vram: Watchdog | None,
    ) -> list[asyncio.Task[None]]:
        """The background tasks; the first ends on SIGTERM/SIGINT, which stops the rest."""
        config, runtime = self.config, self.config.runtime
        tasks = [supervise(self.stopping.wait(), "signals")]
        if watcher is not None:
            tasks.append(supervise(watcher.run(), "health"))
        if runtime.cdi_dir:
            cdi = keep_spec_current(
                runtime.cdi_dir, service, runtime.driver_paths, self._cdi_preload
            )
            tasks.append(supervise(cdi, "cdi"))
        if self.measurer is not None:
            tasks.append(supervise(self.measurer.run(), "measure"))
        refine = self.measurer.refine if self.measurer is not None else lambda d: d
        hotplug = hotplug_watcher(config.discovery, service, self.backends, refine)
        if hotplug is not None:
            tasks.append(supervise(hotplug.run(), "hotplug"))
        if vram is not None:
            tasks.append(supervise(vram.run(), "vram-watchdog"))
        tasks.append(supervise(injector.sweep_every(runtime.sweep_interval), "quota-sweep"))
        tasks.append(supervise(watch_fabric(service, config.discovery), "fabric"))
        if runtime.nri:
            plugin = NriPlugin(injector, runtime, telemetry=self.telemetry)
            tasks.append(supervise(plugin.run(), "nri"))
            tasks.append(supervise(plugin.serve_prelaunched(), "nri-prelaunch"))
            if runtime.runtime_units:
                follow = _follow_runtime(runtime.runtime_units, plugin)
                tasks.append(supervise(follow, "nri-runtime-units"))
        if (interval := notify.watchdog_interval()) is not None:
            tasks.append(supervise(self._watchdog(interval), "watchdog"))
        return tasks

    def _measurer(self, service: NodeService) -> Measurer:
        """The figures on file applied now, before the API serves the devices."""
        self.measurer = build_measurer(self.config, service, self.backends, self.telemetry)
        return self.measurer

    def _injector(self, service: NodeService) -> Injector:
        """Container injection, shared by the NRI plugin and the front ends' API calls."""
        config = self.config
        runtime = replace(
            config.runtime,
            assignment_keyring_file=config.runtime.keyring_path(config.daemon.state_dir),
        )
        key = KeyringFile(
            runtime.assignment_keyring_file,
            config.node.resolved_name(),
            legacy=config.runtime.assignment_key_file,
            log_to=log,
        )
        with contextlib.suppress(AssignmentKeyError):
            key()  # read (and say what is wrong with) it now, not at the first pod
        injector = Injector(
            service,
            InjectorSettings(
                node_name=config.node.resolved_name(),
                run_dir=config.daemon.run_dir,
                mode=config.node.mode,
                runtime=runtime,
                keyring=key,
            ),
        )
        self.injector = injector
        log.info("node mode %s", config.node.mode.value)
        if config.runtime.cdi_dir:
            self._cdi_preload = injector.quota.preload_edits()
            publish_spec(
                config.runtime.cdi_dir, service, config.runtime.driver_paths, self._cdi_preload
            )
        return injector

    def _status(self) -> str:
        assert self.service is not None
        return (
            f"{len(self.service.devices())} devices, "
            f"{len(self.service.allocations())} allocations, health from "
            f"{self.service.health_source}, API on {self.config.daemon.socket}"
        )

    async def _watchdog(self, interval: float) -> None:
        while True:
            notify.watchdog(self._status())
            await asyncio.sleep(interval)

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_stop_signal, sig)
        loop.add_signal_handler(signal.SIGHUP, self._reload)

    def _on_stop_signal(self, sig: signal.Signals) -> None:
        log.info("received %s", sig.name)
        self.stopping.set()

    def _reload(self) -> None:
        notify.reloading()
        try:
            new = load_config(self.config_path, required=self.config_path is not None)
        except ConfigError as e:
            log.error("reload failed, keeping the running configuration: %s", "; ".join(e.lines))
            notify.ready(self._status())
            return
        for key in self.config.restart_needed(new):
            log.warning("reload: %s changed; it takes effect after a restart", key)
        self.config = merge_reloadable(self.config, new)
        for apply in RELOAD_STEPS.values():
            apply(self, self.config)
        log.info("configuration reloaded from %s", new.source)
        notify.ready(self._status())


async def _follow_runtime(units: tuple[str, ...], plugin: NriPlugin) -> None:
    """The runtime's units over D-Bus. dbus-fast is imported here, once the other tasks have
    started: not before READY=1, not in the way of the pre-launch socket's bind.

    Every task of run_tasks is a root, whose end stops hcsd: without dbus-fast (a bare
    install) this says so once and then idles rather than ending."""
    try:
        from hcsd.systemd import follow_units
    except ImportError as e:
        log.warning(
            "not following %s over D-Bus (%s); after a runtime restart the NRI plugin "
            "reconnects on its backoff",
            ", ".join(units),
            e,
        )
        await asyncio.Event().wait()
        return
    await follow_units(units, plugin.runtime_changed)


def _apply_policy(daemon: Daemon, config: Config) -> None:
    assert daemon.service is not None
    daemon.service.set_policy(config.allocator.policy)


def _apply_mode(daemon: Daemon, config: Config) -> None:
    """A node joins or leaves a cluster without a restart (which, with hcsd a required NRI
    plugin, would hold up every container creation on the node meanwhile)."""
    injector = daemon.injector
    assert injector is not None
    if injector.settings.mode is not config.node.mode:
        injector.settings = replace(injector.settings, mode=config.node.mode)
        log.info("node mode %s", config.node.mode.value)


#: How SIGHUP applies each key marked `reload`; a test checks there is a step for every one.
RELOAD_STEPS: dict[str, Callable[[Daemon, Config], None]] = {
    "daemon.log_level": lambda daemon, config: set_level(config.daemon.log_level),
    "allocator.policy": _apply_policy,
    "node.mode": _apply_mode,
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="hcsd",
        description="HCS node daemon: discovers accelerators, keeps the allocation ledger, "
        "serves the local API on a unix socket.",
    )
    parser.add_argument(
        "--config", metavar="PATH", help=f"configuration file (default: {DEFAULT_PATH})"
    )
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="check the configuration file, print every problem as FILE: KEY: WHAT, and exit "
        "(2 if there is any)",
    )
    parser.add_argument(
        "--print-default-config",
        action="store_true",
        help="print the default configuration, every key documented, and exit",
    )
    parser.add_argument(
        "--open-device-nodes",
        nargs="+",
        metavar="PATH",
        help="open each device node read-write as discovery's vendor libraries do, print one "
        "line per node and exit (1 if any failed); as an ExecStartPre= of hcsd.service it "
        "checks what the unit's DeviceAllow= lets hcsd open",
    )
    parser.add_argument("--version", action="version", version=f"hcsd {__version__}")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.print_default_config or args.open_device_nodes:
        return _without_config(args)
    try:
        config = load_config(args.config or DEFAULT_PATH, required=args.config is not None)
    except ConfigError as e:
        priority = "<3>" if os.environ.get("JOURNAL_STREAM") else ""  # journald: priority err
        for line in e.lines:
            print(f"{priority}hcsd: {line}", file=sys.stderr)
        notify.failed("; ".join(e.lines))
        return 2
    if args.check_config:
        print(f"hcsd: configuration {config.source} is valid")
        return 0
    configure_logging(config.daemon.log_level)
    try:
        asyncio.run(Daemon(config, args.config or _existing(DEFAULT_PATH)).run())
    except StartupError as e:
        log.error("%s", e)
        notify.failed(str(e))
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C during shutdown
        return 130
    return 0


def _without_config(args: argparse.Namespace) -> int:
    """The options that print something and exit without reading the configuration."""
    if args.open_device_nodes:
        return open_device_nodes(args.open_device_nodes, lambda line: print(line, flush=True))
    sys.stdout.write(render_default_config())
    return 0


def _existing(path: str) -> str | None:
    return path if os.path.exists(path) else None


if __name__ == "__main__":
    sys.exit(main())
