"""hcsd's configuration file (`/etc/hcsd/hcsd.toml`): the sections of every part, gathered.

Each part declares its own section next to its code (`hcsd.sections`); `Config` names them, one
field per TOML table, in the order the default file shows them. Adding a section is a dataclass
in the part and one line here; reading, checking, the default file, the man page and
docs/configuration.md follow from the fields. Unknown keys are errors: a misspelt key silently
ignored is a setting an operator thinks they have and do not.
"""

from __future__ import annotations

import socket
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hcsd.allocator import AllocatorSection
from hcsd.benchmarks import MeasureSection
from hcsd.contract import paths
from hcsd.daemon.metrics import MetricsSection
from hcsd.discovery.settings import DiscoverySection
from hcsd.health.settings import HealthSection
from hcsd.ledger.ledger import LedgerSection
from hcsd.model import NodeMode
from hcsd.runtime.settings import RuntimeSection
from hcsd.sections import Section, checks, read_section, section, setting, tables, values
from hcsd.watchdog.settings import WatchdogSection

__all__ = [
    "DEFAULT_PATH",
    "Config",
    "ConfigError",
    "DaemonSection",
    "NodeSection",
    "load_config",
    "reloadable_keys",
]

DEFAULT_PATH = paths.CONFIG_FILE


class ConfigError(Exception):
    """The configuration file is unreadable or has bad keys or values: one line per problem,
    each naming the file and the key."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


@dataclass(frozen=True, slots=True)
class NodeSection(Section):
    """`[node]`: this node's identity."""

    name: str = setting(
        "", "Node name reported to the cluster; empty = the host name.", checks.string
    )
    mode: NodeMode = setting(
        NodeMode.STANDALONE,
        'Where a Kubernetes pod\'s devices may come from. "standalone": its own hcs.io/* '
        'annotations or a scheduler assignment. "cluster" (a node the HCS scheduler extender '
        "places pods on): only its signed assignment; a pod asking with hcs.io/* annotations "
        "is refused (no_assignment), so no pod takes devices the scheduler and ComputeQuota "
        "never saw. Containers outside a pod keep their annotations either way.",
        checks.enum(NodeMode),
        reload=True,
    )

    def resolved_name(self) -> str:
        return self.name or socket.gethostname()


@dataclass(frozen=True, slots=True)
class DaemonSection(Section):
    """`[daemon]`: the process itself: its API socket, its files, its logs, its shutdown."""

    socket: str = setting(
        paths.SOCKET,
        "Unix socket of the local gRPC API (mode 0600, root only).",
        checks.path,
    )
    state_dir: str = setting(
        paths.STATE_DIR,
        "Where the ledger (journal, snapshot) lives. Must survive reboots.",
        checks.path,
    )
    run_dir: str = setting(
        paths.RUN_DIR, "Runtime files: per-container quota directories.", checks.path
    )
    log_level: str = setting(
        "info",
        "Lowest level of the log lines hcsd writes.",
        checks.choice("debug", "info", "warning", "error"),
        reload=True,
    )
    shutdown_grace: float = setting(
        5.0, "Seconds that API calls in flight get to finish on SIGTERM.", checks.seconds
    )


@dataclass(frozen=True, slots=True)
class Config(Section):
    """The whole file. Each field is a table; its part takes the section object as it is."""

    node: NodeSection = section(NodeSection, "This node.")
    daemon: DaemonSection = section(
        DaemonSection, "The hcsd process: API socket, state and run directories, logging."
    )
    metrics: MetricsSection = section(MetricsSection, "The Prometheus endpoint.")
    discovery: DiscoverySection = section(
        DiscoverySection, "Which discovery backends run, and the paths each reads."
    )
    allocator: AllocatorSection = section(AllocatorSection, "Placing requests on devices.")
    health: HealthSection = section(
        HealthSection, "Device health: kernel event source, score thresholds, extra rules."
    )
    runtime: RuntimeSection = section(
        RuntimeSection, "Container injection: NRI, CDI, libhcs, assignments."
    )
    watchdog: WatchdogSection = section(
        WatchdogSection, "The VRAM watchdog: the drivers' per-process figures against grants."
    )
    ledger: LedgerSection = section(LedgerSection, "The allocation ledger.")
    measure: MeasureSection = section(
        MeasureSection,
        "The measured fingerprint: a dense FP16 GEMM per idle device through the vendor's "
        "math library; the device is rated by how it compares with a typical card of its "
        "model.",
    )
    source: str = field(default="<defaults>", compare=False)  # the file it was read from

    def restart_needed(self, new: Config) -> list[str]:
        """Keys whose change a SIGHUP cannot apply."""
        old_values, new_values = values(self), values(new)
        return sorted(
            key
            for key in old_values
            if old_values[key] != new_values[key] and key not in reloadable_keys()
        )


def reloadable_keys() -> frozenset[str]:
    """The keys marked `reload`: SIGHUP applies them (the daemon has a step for each)."""
    return frozenset(
        f"{table.name}.{s.name}" for table in tables(Config) for s in table.settings if s.reload
    )


def load_config(path: str | None, *, required: bool = False) -> Config:
    """Read and check a config file; a missing default file means all defaults.

    Raises ConfigError with every problem found, not only the first."""
    raw: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
            source = path
        except FileNotFoundError:
            if required:
                raise ConfigError([f"config file {path} does not exist"]) from None
        except OSError as e:
            raise ConfigError([f"failed to read config {path}: {e.strerror}"]) from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError([f"{path}: failed to parse: {e}"]) from e
    config, problems = read_section(Config, raw)
    if config is None:
        raise ConfigError([f"{source}: {p.key}: {p.message}" for p in problems])
    return replace(config, source=source)
