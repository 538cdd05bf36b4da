"""hcsd's configuration file (`/etc/hcsd/hcsd.toml`): every key, its default and its check.

The table below is the one place a key is defined; `hcsd --print-default-config` renders it
with each key's documentation, so the shipped default file and this code cannot drift apart.
Unknown keys are errors: a misspelt key silently ignored is a setting an operator thinks they
have and do not.
"""

from __future__ import annotations

import socket
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hcsd.contract import paths
from hcsd.model import SpreadPolicy

__all__ = ["DEFAULT_PATH", "Config", "ConfigError", "load_config", "render_default_config"]

DEFAULT_PATH = paths.CONFIG_FILE


class ConfigError(Exception):
    """The configuration file is unreadable or has a bad key or value."""


@dataclass(frozen=True, slots=True)
class Key:
    section: str
    name: str
    default: Any
    doc: str
    check: Callable[[Any], Any]
    reloadable: bool = False


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def _path(value: Any) -> str:
    text = _string(value)
    if text and not text.startswith("/"):
        raise ValueError(f"expected an absolute path, got {text!r}")
    return text


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"expected a positive integer, got {value!r}")
    return value


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"expected a positive number of seconds, got {value!r}")
    return float(value)


def _choice(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return str(value)

    return check


def _listen(value: Any) -> str:
    text = _string(value)
    if not text:
        return text
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT (or an empty string to disable), got {text!r}")
    return text


def _score(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 100:
        raise ValueError(f"expected a score in (0, 100], got {value!r}")
    return float(value)


def _health_rules(value: Any) -> list[dict[str, str]]:
    from hcsd.health.parsing import compile_rules

    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError("expected a list of tables {vendor, code, severity, pattern}")
    compile_rules(value)
    return list(value)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _plugin_index(value: Any) -> str:
    text = _string(value)
    if len(text) != 2 or not text.isdigit():
        raise ValueError(f'expected two digits such as "10", got {text!r}')
    return text


def _percent(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 100:
        raise ValueError(f"expected a percentage in [0, 100], got {value!r}")
    return float(value)


def _bytes(value: Any) -> int:
    from hcsd.quantity import QuantityError, parse_bytes

    try:
        return parse_bytes(_string(value))
    except QuantityError as e:
        raise ValueError(f'expected a quantity such as "512Mi": {e}') from None


def _string_list(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"expected a list of non-empty strings, got {value!r}")
    return list(value)


KEYS: tuple[Key, ...] = (
    Key("node", "name", "", "Node name reported to the cluster; empty = the host name.", _string),
    Key(
        "daemon",
        "socket",
        paths.SOCKET,
        "Unix socket of the local gRPC API (mode 0600, root only).",
        _path,
    ),
    Key(
        "daemon",
        "state_dir",
        paths.STATE_DIR,
        "Where the ledger (journal, snapshot) lives. Must survive reboots.",
        _path,
    ),
    Key(
        "daemon", "run_dir", paths.RUN_DIR, "Runtime files: per-container quota directories.", _path
    ),
    Key(
        "daemon",
        "log_level",
        "info",
        "debug, info, warning or error.",
        _choice("debug", "info", "warning", "error"),
        reloadable=True,
    ),
    Key(
        "daemon",
        "shutdown_grace",
        5.0,
        "Seconds that API calls in flight get to finish on SIGTERM.",
        _seconds,
    ),
    Key(
        "metrics",
        "listen",
        "127.0.0.1:9400",
        "Prometheus text endpoint (GET /metrics) as HOST:PORT; empty disables it.",
        _listen,
    ),
    Key(
        "discovery",
        "backends",
        ["simulated"],
        "Discovery backends to run, in order: simulated, nvidia, ascend, hygon, cambricon, or "
        "auto (every vendor whose accelerators are on the PCI bus).",
        _string_list,
    ),
    Key(
        "discovery",
        "simulated_node",
        paths.SIMULATED_NODE_FILE,
        "Node file for the simulated backend (devices, links, device nodes).",
        _path,
    ),
    Key("discovery", "sysfs", "/sys", "Where sysfs is (PCI attributes, KFD topology).", _path),
    Key("discovery", "dev_root", "/dev", "Where device nodes are stat'ed.", _path),
    Key(
        "discovery",
        "nvml_library",
        "",
        "NVML library to load; empty = the loader's search path (libnvidia-ml.so.1).",
        _path,
    ),
    Key(
        "discovery",
        "dcmi_library",
        "/usr/local/dcmi/libdcmi.so",
        "Ascend DCMI library; when it cannot be loaded, npu-smi is read instead.",
        _path,
    ),
    Key("discovery", "npu_smi", "/usr/local/bin/npu-smi", "Ascend npu-smi tool.", _path),
    Key("discovery", "hy_smi", "/opt/hyhal/bin/hy-smi", "Hygon hy-smi tool (DCU models).", _path),
    Key(
        "discovery",
        "cndev_library",
        "/usr/local/neuware/lib64/libcndev.so",
        "Cambricon CNDev library; when it cannot be loaded, cnmon is read instead.",
        _path,
    ),
    Key("discovery", "cnmon", "/usr/bin/cnmon", "Cambricon cnmon tool.", _path),
    Key(
        "discovery",
        "hotplug",
        True,
        "Watch PCI uevents: a removed device is marked lost at once (real backends only).",
        _boolean,
    ),
    Key(
        "allocator",
        "policy",
        "binpack",
        "binpack fills partly used devices first; spread picks the least used.",
        _choice("binpack", "spread"),
        reloadable=True,
    ),
    Key(
        "health",
        "source",
        "auto",
        "Kernel event source: auto (ebpf, then bcc, then kmsg polling), ebpf, bcc, kmsg or off.",
        _choice("auto", "ebpf", "bcc", "kmsg", "off"),
    ),
    Key("health", "bpf_dir", paths.BPF_DIR, "Where the compiled eBPF objects are.", _path),
    Key(
        "health",
        "quiet_period",
        600.0,
        "Seconds without faults before a degraded or unhealthy device is healthy again.",
        _seconds,
    ),
    Key(
        "health",
        "tick_interval",
        1.0,
        "Seconds between re-evaluations of device health (how soon recovery shows).",
        _seconds,
    ),
    Key("health", "degraded_below", 80.0, "Health score under which a device is degraded.", _score),
    Key(
        "health", "unhealthy_below", 30.0, "Health score under which a device is unhealthy.", _score
    ),
    Key(
        "health",
        "aer_poll_interval",
        5.0,
        "Seconds between polls of PCIe AER counters in sysfs (when no AER tracepoint).",
        _seconds,
    ),
    Key(
        "health",
        "rules",
        [],
        "Extra kernel-line rules: [{vendor, code, severity, pattern}], pattern with (?P<bus>).",
        _health_rules,
    ),
    Key(
        "runtime",
        "nri",
        True,
        "Serve containerd/CRI-O as an NRI plugin (devices, env, mounts, quota per container).",
        _boolean,
    ),
    Key("runtime", "nri_socket", paths.NRI_SOCKET, "The runtime's NRI socket.", _path),
    Key(
        "runtime",
        "nri_prelaunch_socket",
        paths.NRI_PRELAUNCH_SOCKET,
        "Where hcs-nri-plugin (the pre-launched form in /opt/nri/plugins) reaches hcsd.",
        _path,
    ),
    Key(
        "runtime",
        "plugin_index",
        "10",
        "Two-digit NRI plugin index (lower runs first).",
        _plugin_index,
    ),
    Key(
        "runtime",
        "libhcs_path",
        paths.LIBHCS,
        "The quota library preloaded into containers.",
        _path,
    ),
    Key(
        "runtime",
        "assignment_key_file",
        paths.KEY_FILE,
        "HMAC key shared with the scheduler extender to verify hcs.io/assignment.",
        _path,
    ),
    Key(
        "runtime",
        "assignment_max_age",
        604800.0,
        "Seconds a scheduler assignment stays valid for a container's first start.",
        _seconds,
    ),
    Key(
        "runtime",
        "cdi_dir",
        paths.CDI_DIR,
        "Where hcsd writes its CDI spec (hcs.io-device.yaml); empty disables it.",
        _path,
    ),
    Key(
        "watchdog",
        "enabled",
        True,
        "Compare each container's device memory, as the vendor's driver reports it per "
        "process, with its grant (NVML, KFD sysfs, DCMI, CNDev; see docs/libhcs.md).",
        _boolean,
    ),
    Key("watchdog", "interval", 5.0, "Seconds between watchdog polls.", _seconds),
    Key(
        "watchdog",
        "policy",
        "warn",
        "warn: log, count and publish a container over its grant; kill: also SIGKILL every "
        "process of it.",
        _choice("warn", "kill"),
    ),
    Key(
        "watchdog",
        "tolerance_percent",
        5.0,
        "Share of the grant a container may exceed (allocator rounding, library pools).",
        _percent,
    ),
    Key(
        "watchdog",
        "process_overhead",
        "1Gi",
        "Device memory each process may hold beyond its grant: the CUDA context and loaded "
        "modules no allocation call returns, so libhcs cannot charge them (518Mi for a bare "
        "context, 586Mi for PyTorch on an H100; 1.7Gi with CUDA_MODULE_LOADING=EAGER).",
        _bytes,
    ),
    Key(
        "ledger",
        "compact_after",
        10_000,
        "Journal records after which the ledger writes a snapshot and starts afresh.",
        _positive_int,
    ),
)


@dataclass(frozen=True, slots=True)
class Config:
    node_name: str
    socket: str
    state_dir: str
    run_dir: str
    log_level: str
    shutdown_grace: float
    metrics_listen: str
    backends: list[str]
    simulated_node: str
    policy: SpreadPolicy
    compact_after: int
    health_source: str = "auto"
    bpf_dir: str = paths.BPF_DIR
    quiet_period: float = 600.0
    tick_interval: float = 1.0
    degraded_below: float = 80.0
    unhealthy_below: float = 30.0
    aer_poll_interval: float = 5.0
    health_rules: list[dict[str, str]] = field(default_factory=list)
    nri: bool = True
    nri_socket: str = paths.NRI_SOCKET
    nri_prelaunch_socket: str = paths.NRI_PRELAUNCH_SOCKET
    plugin_index: str = "10"
    libhcs_path: str = paths.LIBHCS
    assignment_key_file: str = paths.KEY_FILE
    assignment_max_age: float = 604800.0
    cdi_dir: str = paths.CDI_DIR
    watchdog_enabled: bool = True
    watchdog_interval: float = 5.0
    watchdog_policy: str = "warn"
    watchdog_tolerance_percent: float = 5.0
    watchdog_process_overhead: int = 2**30
    source: str = "<defaults>"
    values: Mapping[str, Any] = field(default_factory=dict)

    def restart_needed(self, new: Config) -> list[str]:
        """Keys whose change a SIGHUP cannot apply."""
        return sorted(
            f"{k.section}.{k.name}"
            for k in KEYS
            if not k.reloadable
            and self.values.get(f"{k.section}.{k.name}") != new.values.get(f"{k.section}.{k.name}")
        )


def load_config(path: str | None, *, required: bool = False) -> Config:
    """Read and check a config file; a missing default file means all defaults."""
    raw: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
            source = path
        except FileNotFoundError:
            if required:
                raise ConfigError(f"config file {path} does not exist") from None
        except OSError as e:
            raise ConfigError(f"failed to read config {path}: {e.strerror}") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"failed to parse config {path}: {e}") from e
    return _build(raw, source)


def _build(raw: Mapping[str, Any], source: str) -> Config:
    known: dict[str, dict[str, Key]] = {}
    for key in KEYS:
        known.setdefault(key.section, {})[key.name] = key
    for section, table in raw.items():
        if section not in known:
            raise ConfigError(
                f"{source}: unknown section [{section}] (known: {', '.join(sorted(known))})"
            )
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [{section}] must be a table")
        for name in table:
            if name not in known[section]:
                names = ", ".join(sorted(known[section]))
                raise ConfigError(f"{source}: unknown key {section}.{name} (known: {names})")
    values: dict[str, Any] = {}
    for key in KEYS:
        value = raw.get(key.section, {}).get(key.name, key.default)
        try:
            values[f"{key.section}.{key.name}"] = key.check(value)
        except ValueError as e:
            raise ConfigError(f"{source}: {key.section}.{key.name}: {e}") from None
    return Config(
        node_name=values["node.name"] or socket.gethostname(),
        socket=values["daemon.socket"],
        state_dir=values["daemon.state_dir"],
        run_dir=values["daemon.run_dir"],
        log_level=values["daemon.log_level"],
        shutdown_grace=values["daemon.shutdown_grace"],
        metrics_listen=values["metrics.listen"],
        backends=values["discovery.backends"],
        simulated_node=values["discovery.simulated_node"],
        policy=SpreadPolicy(values["allocator.policy"]),
        compact_after=values["ledger.compact_after"],
        health_source=values["health.source"],
        bpf_dir=values["health.bpf_dir"],
        quiet_period=values["health.quiet_period"],
        tick_interval=values["health.tick_interval"],
        degraded_below=values["health.degraded_below"],
        unhealthy_below=values["health.unhealthy_below"],
        aer_poll_interval=values["health.aer_poll_interval"],
        health_rules=values["health.rules"],
        nri=values["runtime.nri"],
        nri_socket=values["runtime.nri_socket"],
        nri_prelaunch_socket=values["runtime.nri_prelaunch_socket"],
        plugin_index=values["runtime.plugin_index"],
        libhcs_path=values["runtime.libhcs_path"],
        assignment_key_file=values["runtime.assignment_key_file"],
        assignment_max_age=values["runtime.assignment_max_age"],
        cdi_dir=values["runtime.cdi_dir"],
        watchdog_enabled=values["watchdog.enabled"],
        watchdog_interval=values["watchdog.interval"],
        watchdog_policy=values["watchdog.policy"],
        watchdog_tolerance_percent=values["watchdog.tolerance_percent"],
        watchdog_process_overhead=values["watchdog.process_overhead"],
        source=source,
        values=values,
    )


def render_default_config() -> str:
    """The default config file, every key commented with its documentation."""
    lines = [
        "# hcsd configuration. Every key is shown with its default; uncomment to change.",
        "# Keys marked (reload) take effect on SIGHUP (systemctl reload hcsd); the others",
        "# need a restart.",
    ]
    section = None
    for key in KEYS:
        if key.section != section:
            section = key.section
            lines += ["", f"[{section}]"]
        suffix = " (reload)" if key.reloadable else ""
        lines.append(f"# {key.doc}{suffix}")
        lines.append(f"#{key.name} = {_toml(key.default)}")
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)
