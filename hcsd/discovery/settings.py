"""`[discovery]`: which backends run and every path they read (sysfs, /dev, vendor libraries
and tools), so tests point them at fakes and operators at wherever their driver installed.

Each vendor backend takes this section whole: one object, one default per path.
"""

from __future__ import annotations

from dataclasses import dataclass

from hcsd.contract import paths
from hcsd.contract.names import FABRIC_DOMAIN
from hcsd.sections import Section, checks, setting

__all__ = ["BACKEND_NAMES", "VENDOR_BACKENDS", "DiscoverySection"]


def _fabric_domain(value: object) -> str:
    if not isinstance(value, str) or (value and not FABRIC_DOMAIN.fullmatch(value)):
        raise ValueError
    return value


fabric_domain = checks.Check(
    "an empty string or a name of letters, digits and :._/- (at most 64 characters)",
    _fabric_domain,
)

#: The real backends, in the order `auto` runs them; the daemon has a factory for each name.
VENDOR_BACKENDS = ("nvidia", "ascend", "hygon", "cambricon")
BACKEND_NAMES = ("simulated", *VENDOR_BACKENDS)


@dataclass(frozen=True, slots=True)
class DiscoverySection(Section):
    """The backends to run and where each finds its vendor's library, tools and files."""

    backends: tuple[str, ...] = setting(
        ("auto",),
        "Discovery backends to run, in order: simulated, nvidia, ascend, hygon, cambricon, or "
        "auto (every vendor whose accelerators are on the PCI bus; a node with none runs with "
        "zero devices and says why).",
        checks.names(*BACKEND_NAMES, "auto"),
    )
    simulated_node: str = setting(
        paths.SIMULATED_NODE_FILE,
        "Node file for the simulated backend (devices, links, device nodes).",
        checks.path,
    )
    sysfs: str = setting(
        "/sys",
        "Where sysfs is (PCI attributes, KFD topology, AER counters, RDMA ports).",
        checks.path,
    )
    fabric_domain: str = setting(
        "",
        "The node's RDMA fabric domain, as the scheduler keeps a job's pods on one; empty = "
        "discovered (ib:<subnet prefix> of the active InfiniBand ports). Set it for RoCE, "
        "and for InfiniBand subnets left at the default prefix fe80:0000:0000:0000.",
        fabric_domain,
    )
    dev_root: str = setting("/dev", "Where device nodes are stat'ed.", checks.path)
    nvml_library: str = setting(
        "",
        "NVML library to load; empty = the loader's search path (libnvidia-ml.so.1).",
        checks.path_or_empty,
    )
    dcmi_library: str = setting(
        "/usr/local/dcmi/libdcmi.so",
        "Ascend DCMI library; when it cannot be loaded, npu-smi is read instead.",
        checks.path,
    )
    npu_smi: str = setting("/usr/local/bin/npu-smi", "Ascend npu-smi tool.", checks.path)
    hy_smi: str = setting("/opt/hyhal/bin/hy-smi", "Hygon hy-smi tool (DCU models).", checks.path)
    cndev_library: str = setting(
        "/usr/local/neuware/lib64/libcndev.so",
        "Cambricon CNDev library; when it cannot be loaded, cnmon is read instead.",
        checks.path,
    )
    cnmon: str = setting("/usr/bin/cnmon", "Cambricon cnmon tool.", checks.path)
    hotplug: bool = setting(
        True,
        "Watch PCI uevents: a removed device is marked lost at once (real backends only).",
        checks.boolean,
    )
