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
from pathlib import Path

from hcsd import __version__
from hcsd.api.server import ApiServer, SocketInUse
from hcsd.contract.keys import AssignmentKeyError, KeyFile
from hcsd.daemon import notify
from hcsd.daemon.backends import VENDOR_BACKENDS, expand_auto, hotplug_watcher
from hcsd.daemon.config import DEFAULT_PATH, Config, ConfigError, load_config, render_default_config
from hcsd.daemon.logs import configure_logging, set_level
from hcsd.daemon.metrics import MetricsServer
from hcsd.daemon.vram import vram_watchdog
from hcsd.discovery import DiscoveryBackend, DiscoveryError, Inventory, discover_all
from hcsd.discovery.backends.simulated import SimulatedBackend
from hcsd.health.analyzer import AnalyzerSettings
from hcsd.health.parsing import DEFAULT_RULES, compile_rules
from hcsd.health.watching import HealthWatcher, WatcherSettings
from hcsd.ledger import Ledger, LedgerError
from hcsd.runtime.cdi import keep_spec_current, write_spec
from hcsd.runtime.edits import ContainerEdits
from hcsd.runtime.injector import Injector, InjectorSettings
from hcsd.runtime.nri.plugin import NriPlugin
from hcsd.service import NodeService
from hcsd.tasks import run_tasks, supervise
from hcsd.watchdog import Watchdog

__all__ = ["main"]

log = logging.getLogger("hcsd")

BACKENDS: dict[str, Callable[[Config], DiscoveryBackend]] = {
    "simulated": lambda config: SimulatedBackend(Path(config.simulated_node)),
    **VENDOR_BACKENDS,
}


class StartupError(Exception):
    """hcsd cannot start; the message is the one line the operator needs."""


def build_backends(config: Config) -> list[DiscoveryBackend]:
    backends = []
    for name in expand_auto(config.backends, config):
        factory = BACKENDS.get(name)
        if factory is None:
            raise StartupError(
                f"unknown discovery backend {name!r} (available: {', '.join(sorted(BACKENDS))})"
            )
        backends.append(factory(config))
    return backends


class Daemon:
    def __init__(self, config: Config, config_path: str | None) -> None:
        self.config = config
        self.config_path = config_path
        self.stopping = asyncio.Event()
        self.service: NodeService | None = None
        self.backends: list[DiscoveryBackend] = []
        self._cdi_preload: ContainerEdits | None = None  # libhcs in every CDI spec entry

    def _open_state(self) -> tuple[Inventory, Ledger]:
        """Discovery and ledger replay: what must work before anything is served."""
        config = self.config
        self.backends = build_backends(config)
        try:
            inventory = discover_all(config.node_name, self.backends)
        except DiscoveryError as e:
            raise StartupError(f"failed to discover devices: {e}") from e
        ledger = Ledger(config.state_dir, compact_after=config.compact_after)
        try:
            report = ledger.open()
        except (LedgerError, OSError) as e:
            raise StartupError(f"failed to open the ledger: {e}") from e
        log.info(
            "ledger %s: %d allocation(s), %d record(s) replayed after snapshot %d%s",
            config.state_dir,
            report.allocations,
            report.records,
            report.snapshot_seq,
            f", {report.torn_bytes} torn byte(s) dropped" if report.torn_bytes else "",
        )
        return inventory, ledger

    async def run(self) -> None:
        config = self.config
        inventory, ledger = self._open_state()
        service = NodeService(inventory, ledger, policy=config.policy, version=__version__)
        self.service = service
        for orphan in ledger.orphans():
            log.warning(
                "%s: holds device(s) this node no longer has: %s",
                orphan.container_id,
                ", ".join(orphan.device_uuids),
            )
        watcher = self._health_watcher(service)
        injector = self._injector(service)
        vram = vram_watchdog(config, service)
        api = ApiServer(service, config.socket, injector)
        metrics = (
            MetricsServer(service, config.metrics_listen, watcher, vram)
            if config.metrics_listen
            else None
        )
        try:
            try:
                await api.start()
            except (SocketInUse, RuntimeError, OSError) as e:
                raise StartupError(f"failed to serve the API on {config.socket}: {e}") from e
            if metrics is not None:
                try:
                    await metrics.start()
                except OSError as e:
                    raise StartupError(
                        f"failed to serve metrics on {config.metrics_listen}: {e}"
                    ) from e
            self._install_signals()
            if watcher is not None:
                service.set_health_source(watcher.start(asyncio.get_running_loop()))
            log.info(
                "hcsd %s ready on node %s: %d device(s) from %s",
                __version__,
                inventory.node_name,
                len(inventory.devices),
                ", ".join(inventory.backends),
            )
            # Everything built so far (modules, grpc, protobuf descriptors, inventory) lives as
            # long as the process: keep it out of every later collection, which would otherwise
            # rescan it and show up as millisecond stalls in the API's tail latency.
            gc.freeze()
            notify.ready(self._status())
            tasks = [supervise(self.stopping.wait(), "signals")]
            if watcher is not None:
                tasks.append(supervise(watcher.run(), "health"))
            if config.cdi_dir:
                tasks.append(
                    supervise(
                        keep_spec_current(config.cdi_dir, service, self._cdi_preload),
                        "cdi",
                    )
                )
            tasks += self._hotplug_tasks(service)
            tasks += [supervise(vram.run(), "vram-watchdog")] if vram is not None else []
            if config.nri:
                plugin = NriPlugin(
                    injector, socket_path=config.nri_socket, index=config.plugin_index
                )
                tasks.append(supervise(plugin.run(), "nri"))
                tasks.append(
                    supervise(
                        plugin.serve_prelaunched(config.nri_prelaunch_socket), "nri-prelaunch"
                    )
                )
            if (interval := notify.watchdog_interval()) is not None:
                tasks.append(supervise(self._watchdog(interval), "watchdog"))
            await run_tasks(tasks, grace=1.0)
            log.info("stopping: draining API calls (up to %.1fs)", config.shutdown_grace)
            notify.stopping()
        finally:
            await api.stop(config.shutdown_grace)
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

    def _hotplug_tasks(self, service: NodeService) -> list[asyncio.Task[None]]:
        """The hot-plug watcher, when enabled and a real backend runs."""
        watcher = hotplug_watcher(self.config, service, self.backends)
        return [] if watcher is None else [supervise(watcher.run(), "hotplug")]

    def _injector(self, service: NodeService) -> Injector:
        """Container injection, shared by the NRI plugin and the hooks' API calls."""
        config = self.config
        key = KeyFile(config.assignment_key_file, log_to=log)
        with contextlib.suppress(AssignmentKeyError):
            key()  # read (and say what is wrong with) it now, not at the first pod
        injector = Injector(
            service,
            InjectorSettings(
                node_name=config.node_name,
                run_dir=config.run_dir,
                libhcs_path=config.libhcs_path,
                key_loader=key,
                assignment_max_age=config.assignment_max_age,
            ),
        )
        if config.cdi_dir:
            try:
                self._cdi_preload = injector.quota.preload_edits()
                write_spec(
                    config.cdi_dir, [s.device for s in service.devices()], None, self._cdi_preload
                )
                log.info("CDI spec in %s is current", config.cdi_dir)
            except OSError as e:
                log.warning("cannot write the CDI spec in %s: %s", config.cdi_dir, e)
        return injector

    def _health_watcher(self, service: NodeService) -> HealthWatcher | None:
        config = self.config
        if config.health_source == "off":
            return None
        settings = WatcherSettings(
            source=config.health_source,
            bpf_dir=config.bpf_dir,
            aer_interval=config.aer_poll_interval,
            tick_interval=config.tick_interval,
            analyzer=AnalyzerSettings(
                quiet_period=config.quiet_period,
                degraded_below=config.degraded_below,
                recovered_above=min(100.0, config.degraded_below + 10.0),
                unhealthy_below=config.unhealthy_below,
            ),
            rules=(*DEFAULT_RULES, *compile_rules(config.health_rules)),
        )
        return HealthWatcher(service, settings, backends=self.backends)

    def _status(self) -> str:
        assert self.service is not None
        return (
            f"{len(self.service.devices())} devices, "
            f"{len(self.service.allocations())} allocations, health from "
            f"{self.service.health_source}, API on {self.config.socket}"
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
            log.error("reload failed, keeping the running configuration: %s", e)
            notify.ready(self._status())
            return
        for key in self.config.restart_needed(new):
            log.warning("reload: %s changed; it takes effect after a restart", key)
        set_level(new.log_level)
        assert self.service is not None
        self.service.set_policy(new.policy)
        self.config = _merge_reloadable(self.config, new)
        log.info("configuration reloaded from %s", new.source)
        notify.ready(self._status())


def _merge_reloadable(old: Config, new: Config) -> Config:
    from dataclasses import replace

    values = dict(old.values)
    values.update({"daemon.log_level": new.log_level, "allocator.policy": new.policy.value})
    return replace(old, log_level=new.log_level, policy=new.policy, values=values)


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
        "--check-config", action="store_true", help="validate the configuration and exit"
    )
    parser.add_argument(
        "--print-default-config",
        action="store_true",
        help="print the default configuration, every key documented, and exit",
    )
    parser.add_argument("--version", action="version", version=f"hcsd {__version__}")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.print_default_config:
        sys.stdout.write(render_default_config())
        return 0
    try:
        config = load_config(args.config or DEFAULT_PATH, required=args.config is not None)
    except ConfigError as e:
        print(f"hcsd: {e}", file=sys.stderr)
        return 2
    if args.check_config:
        print(f"hcsd: configuration {config.source} is valid")
        return 0
    configure_logging(config.log_level)
    try:
        asyncio.run(Daemon(config, args.config or _existing(DEFAULT_PATH)).run())
    except StartupError as e:
        log.error("%s", e)
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C during shutdown
        return 130
    return 0


def _existing(path: str) -> str | None:
    return path if os.path.exists(path) else None


if __name__ == "__main__":
    sys.exit(main())
