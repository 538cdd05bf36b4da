"""`[runtime]`: how containers get their devices (NRI, CDI), libhcs, the assignment key, and
`[runtime.driver_paths]`: the driver files each vendor's containers get mounted.

The injector, the NRI plugin and the CDI spec take this section whole, so a driver path set in
the file reaches every front end the same way.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from hcsd.contract import paths
from hcsd.contract.paths import KEYRING_NAME
from hcsd.model import Vendor
from hcsd.runtime.checkpoints import CheckpointSection
from hcsd.runtime.driver_settings import (
    AscendDriverFiles,
    CambriconDriverFiles,
    DriverFiles,
    LibraryPaths,
    NvidiaDriverFiles,
)
from hcsd.sections import Section, checks, section, setting

__all__ = ["DriverPaths", "RuntimeSection"]

_MOUNTED = "mounted read-only where they exist on the host"


@dataclass(frozen=True, slots=True)
class DriverPaths(Section):
    """Host paths of each vendor's driver (libraries, tools, install info), mounted into the
    containers that hold that vendor's devices. The usual install locations of the vendors'
    own container runtimes; a vendor CDI spec (`nvidia-ctk cdi generate`), where present,
    replaces them with the exact files of the installed driver."""

    nvidia: tuple[str, ...] = setting(
        ("/usr/local/nvidia",), f"NVIDIA driver directories, {_MOUNTED}.", checks.path_list
    )
    ascend: tuple[str, ...] = setting(
        (
            "/usr/local/Ascend/driver/lib64",
            "/usr/local/Ascend/driver/include",
            "/usr/local/Ascend/driver/tools",
            "/usr/local/dcmi",
            "/usr/local/bin/npu-smi",
            "/etc/ascend_install.info",
        ),
        f"Ascend driver files (libraries, DCMI, npu-smi, install info), {_MOUNTED}.",
        checks.path_list,
    )
    hygon: tuple[str, ...] = setting(
        ("/opt/hygondriver", "/opt/hyhal"),
        "Hygon driver directories (DTK driver, HAL), mounted whole, read-only, where they exist "
        "on the host, into every Hygon container (HAMi's DCU device plugin mounts /opt/hyhal "
        "for every container, the DTK directory only for one given a slice of a DCU).",
        checks.path_list,
    )
    cambricon: tuple[str, ...] = setting(
        (),
        f"Cambricon driver directories, {_MOUNTED}; none by default: Cambricon's device "
        "plugin mounts none (its files are in cambricon_files).",
        checks.path_list,
    )
    library_path: LibraryPaths = section(
        LibraryPaths,
        "Library directories per vendor, put first in the container's LD_LIBRARY_PATH.",
    )
    ascend_files: AscendDriverFiles = section(
        AscendDriverFiles,
        "The Ascend driver's files listed as Ascend Docker Runtime lists them, mounted where no "
        "Ascend CDI spec exists.",
    )
    nvidia_files: NvidiaDriverFiles = section(
        NvidiaDriverFiles,
        "The NVIDIA driver's files found as libnvidia-container finds them (the ld.so cache, "
        "the tools' directories), mounted file by file where no NVIDIA CDI spec exists.",
    )
    cambricon_files: CambriconDriverFiles = section(
        CambriconDriverFiles,
        "The Cambricon driver's files as Cambricon's device plugin mounts them (cnmon), in the "
        "same form as nvidia_files, mounted file by file (hcsd reads no Cambricon CDI spec).",
    )

    def of(self, vendor: Vendor) -> Sequence[str]:
        """The paths for one vendor (a field per `Vendor`, checked by the tests)."""
        paths: Sequence[str] = getattr(self, vendor.value)
        return paths

    def files_of(self, vendor: Vendor) -> DriverFiles | None:
        """The vendor's file-by-file section, where its runtime mounts file by file (Ascend's
        runtime reads a mount list instead: `ascend_files`; Hygon's mounts directories)."""
        if vendor is Vendor.NVIDIA:
            return self.nvidia_files
        if vendor is Vendor.CAMBRICON:
            return self.cambricon_files
        return None


@dataclass(frozen=True, slots=True)
class RuntimeSection(Section):
    """Container injection: the NRI plugin, CDI, libhcs, assignments and driver mounts."""

    nri: bool = setting(
        True,
        "Serve containerd/CRI-O as an NRI plugin (devices, env, mounts, quota per container).",
        checks.boolean,
    )
    nri_socket: str = setting(paths.NRI_SOCKET, "The runtime's NRI socket.", checks.path)
    nri_prelaunch_socket: str = setting(
        paths.NRI_PRELAUNCH_SOCKET,
        "Where hcs-nri-plugin (the pre-launched form in /opt/nri/plugins) reaches hcsd.",
        checks.path,
    )
    runtime_units: tuple[str, ...] = setting(
        ("containerd.service", "crio.service"),
        "systemd units of the container runtime, followed over D-Bus: when one is starting or "
        "active again the NRI plugin reconnects as soon as the runtime listens instead of at "
        "the end of its backoff (up to 10 s); empty, or no systemd on a system bus: the "
        "backoff alone.",
        checks.unit_names,
    )
    plugin_index: str = setting(
        "10", "Two-digit NRI plugin index (lower runs first).", checks.two_digits
    )
    libhcs_path: str = setting(
        paths.LIBHCS, "The quota library preloaded into containers.", checks.path
    )
    assignment_keyring_file: str = setting(
        "",
        "This node's keys (key id -> key) that verify hcs.io/assignment: written by "
        "InstallKeys (hcs-syncer), or by hand (docs/cluster.md, Keys and trust); empty: "
        "keyring.json in daemon.state_dir.",
        checks.path_or_empty,
    )
    assignment_key_file: str = setting(
        paths.KEY_FILE,
        'The single key of earlier releases: verifies version-1 assignments (key id ""), '
        "used only while the file exists.",
        checks.path,
    )
    assignment_max_age: float = setting(
        600.0,
        "Seconds after its issue a scheduler assignment is accepted for its pod's first "
        "container on this node, counted to the pod sandbox's start where the NRI plugin "
        "sees it (else to the first container); the pod's later containers (restarts) need "
        "no age.",
        checks.seconds,
    )
    assignment_forget_after: float = setting(
        86400.0,
        "Seconds a pod with no container holding devices stays remembered as accepted "
        "(longer than kubelet's restart back-off).",
        checks.seconds,
    )
    cdi_dir: str = setting(
        paths.CDI_DIR,
        "Where hcsd writes its CDI spec (hcs.io-device.yaml); empty disables it.",
        checks.path_or_empty,
    )
    sweep_interval: float = setting(
        60.0,
        "Seconds between sweeps that retry removing the quota directories of ended containers "
        "(left by a removal that failed at the container's stop).",
        checks.seconds,
    )
    driver_paths: DriverPaths = section(
        DriverPaths,
        "Driver files mounted into containers, per vendor; a vendor CDI spec, where "
        "present, replaces them.",
    )
    checkpoints: CheckpointSection = section(
        CheckpointSection,
        "Checkpoint resume: HCS_RESUME_FROM and HCS_RESUME_STATUS for pods that name their "
        "checkpoint directory with hcs.io/checkpoint-path (docs/runtime.md).",
    )

    def keyring_path(self, state_dir: str) -> str:
        """Where this node's keyring lives: the setting, else beside the ledger (root's
        state, which hcsd's unit may write, unlike /etc)."""
        return self.assignment_keyring_file or os.path.join(state_dir, KEYRING_NAME)
