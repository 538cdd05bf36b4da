"""`[runtime.driver_paths.*_files]`: how hcsd finds a vendor driver's files on a host without
that vendor's CDI spec, the way the vendor's own container runtime does (docs/runtime.md,
Driver files). One form for every vendor that mounts file by file, each with its own defaults.

NVIDIA's lists are libnvidia-container's for the `compute` and `utility` capabilities (its
`src/nvc_info.c`: `compute_libs`, `utility_libs`, `compute_bins`, `utility_bins`); its
graphics, video and display sets are left out. Cambricon's is what its Kubernetes device plugin
mounts (Cambricon/cambricon-k8s-device-plugin, `device-plugin/pkg/mlu/server.go`): cnmon.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hcsd.model import Vendor
from hcsd.sections import Section, checks, setting

__all__ = [
    "AscendDriverFiles",
    "CambriconDriverFiles",
    "DriverFiles",
    "LibraryPaths",
    "NvidiaDriverFiles",
]

COMPUTE_LIBRARIES = (
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-opencl.so",
    "libnvidia-gpucomp.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-fatbinaryloader.so",
    "libnvidia-allocator.so",
    "libnvidia-compiler.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
    "libnvidia-nvvm.so",
)
UTILITY_LIBRARIES = ("libnvidia-ml.so", "libnvidia-cfg.so", "libnvidia-nscq.so")
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nv-fabricmanager",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)


_SYSTEM_LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib64",
)
_BINARY_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def _discover() -> bool:
    return setting(
        True,
        "Look for the driver's files (false: only the vendor's directories in driver_paths).",
        checks.boolean,
    )


def _driver_root() -> str:
    return setting(
        "/",
        "Where the host's file system is (as nvidia-ctk's --driver-root): the cache, the "
        "directories and the files below are looked up under it.",
        checks.path,
    )


def _ld_cache() -> str:
    return setting("/etc/ld.so.cache", "The ld.so cache to read.", checks.path)


def _library_dirs(default: tuple[str, ...]) -> tuple[str, ...]:
    return setting(
        default,
        "Directories a library may be in (after resolving links); any other is refused.",
        checks.path_list,
    )


def _libraries(default: tuple[str, ...]) -> tuple[str, ...]:
    return setting(
        default,
        "Library names looked up in the cache (a name matches itself and name.*); empty: the "
        "cache is not read.",
        checks.string_list,
    )


def _binary_dirs() -> tuple[str, ...]:
    return setting(
        _BINARY_DIRS,
        "Where the tools are looked for, in order (the vendors' runtimes search PATH).",
        checks.path_list,
    )


def _binaries(default: tuple[str, ...]) -> tuple[str, ...]:
    return setting(default, "The driver's tools, each the first found.", checks.string_list)


def _container_binary_dir(default: str) -> str:
    return setting(
        default,
        "Where a tool appears in the container (DIR/NAME); empty: at its path on the host.",
        checks.path_or_empty,
    )


@dataclass(frozen=True, slots=True)
class DriverFiles(Section):
    """A vendor driver's libraries (from the ld.so cache) and tools, mounted file by file and
    read-only where hcsd uses no CDI spec of that vendor (it reads NVIDIA's only). Only
    root-owned regular files that no group or other user may write are mounted, and libraries
    only from the listed directories: a cache entry pointing anywhere else is skipped. Each
    vendor's section is a subclass that gives its own defaults (`NvidiaDriverFiles`,
    `CambriconDriverFiles`); the search (`driver_files.py`) is one for all."""

    label: ClassVar[str] = "driver"  # names the vendor in the log

    discover: bool = _discover()
    driver_root: str = _driver_root()
    ld_cache: str = _ld_cache()
    library_dirs: tuple[str, ...] = _library_dirs(_SYSTEM_LIBRARY_DIRS)
    libraries: tuple[str, ...] = _libraries(())
    binary_dirs: tuple[str, ...] = _binary_dirs()
    binaries: tuple[str, ...] = _binaries(())
    container_library_dir: str = setting(
        "/usr/local/lib",
        "Where the libraries appear in the container, under their file name and their cache "
        "name (soname).",
        checks.path,
    )
    container_binary_dir: str = _container_binary_dir("")


@dataclass(frozen=True, slots=True)
class NvidiaDriverFiles(DriverFiles):
    """The NVIDIA driver's files, found as libnvidia-container finds them: libraries from the
    ld.so cache, tools from the binary directories, the GSP firmware of libcuda's version."""

    label: ClassVar[str] = "NVIDIA driver"

    library_dirs: tuple[str, ...] = _library_dirs(
        (*_SYSTEM_LIBRARY_DIRS, "/usr/local/nvidia/lib64")
    )
    libraries: tuple[str, ...] = _libraries(COMPUTE_LIBRARIES + UTILITY_LIBRARIES)
    binaries: tuple[str, ...] = _binaries(BINARIES)
    container_library_dir: str = setting(
        "/usr/local/nvidia/lib64",
        "Where the libraries appear in the container, under their file name and their cache "
        "name (soname). The default is hcsd's own directory, put first in LD_LIBRARY_PATH "
        "(library_path.nvidia), right on any machine and image layout; a system directory "
        "(/usr/lib/x86_64-linux-gnu, /usr/lib64 for the Red Hat family, "
        "/usr/lib/aarch64-linux-gnu on Arm) also serves setuid programs and those that ignore "
        "LD_LIBRARY_PATH, but only in images of that layout.",
        checks.path,
    )
    container_binary_dir: str = _container_binary_dir("/usr/bin")
    firmware: bool = setting(
        True,
        "Mount /lib/firmware/nvidia/VERSION (the GSP firmware of libcuda's version) where it "
        "exists, as libnvidia-container does.",
        checks.boolean,
    )


@dataclass(frozen=True, slots=True)
class CambriconDriverFiles(DriverFiles):
    """The Cambricon driver's files as Cambricon's device plugin mounts them: cnmon, one file
    at its host path (its --cnmon-path); that plugin mounts no library, so none is listed
    here (it leaves the user-space libraries to the image; list libcndev.so and the like to
    mount the host's)."""

    label: ClassVar[str] = "Cambricon driver"

    library_dirs: tuple[str, ...] = _library_dirs(
        (*_SYSTEM_LIBRARY_DIRS, "/usr/local/neuware/lib64")
    )
    binaries: tuple[str, ...] = _binaries(("cnmon",))
    container_library_dir: str = setting(
        "/usr/local/neuware/lib64",
        "Where the libraries appear in the container, under their file name and their cache "
        "name (soname): Neuware's library directory, put first in LD_LIBRARY_PATH "
        "(library_path.cambricon).",
        checks.path,
    )


_LISTED = "prepended to the container's LD_LIBRARY_PATH when something is mounted in them"


@dataclass(frozen=True, slots=True)
class LibraryPaths(Section):
    """Each vendor's library directories inside its driver paths (mounted at the same place):
    where no vendor CDI spec exists they go first in the container's LD_LIBRARY_PATH, before
    the image's own directories, which stay."""

    nvidia: tuple[str, ...] = setting(
        ("/usr/local/nvidia/lib64",), f"NVIDIA library directories, {_LISTED}.", checks.path_list
    )
    ascend: tuple[str, ...] = setting(
        (
            "/usr/local/Ascend/driver/lib64",
            "/usr/local/Ascend/driver/lib64/common",
            "/usr/local/Ascend/driver/lib64/driver",
        ),
        f"Ascend library directories, {_LISTED}.",
        checks.path_list,
    )
    hygon: tuple[str, ...] = setting(
        ("/opt/hyhal/lib",), f"Hygon library directories, {_LISTED}.", checks.path_list
    )
    cambricon: tuple[str, ...] = setting(
        ("/usr/local/neuware/lib64",),
        f"Cambricon library directories, {_LISTED}.",
        checks.path_list,
    )

    def of(self, vendor: Vendor) -> tuple[str, ...]:
        """The directories for one vendor (a field per `Vendor`)."""
        directories: tuple[str, ...] = getattr(self, vendor.value)
        return directories


@dataclass(frozen=True, slots=True)
class AscendDriverFiles(Section):
    """The mount list of Ascend Docker Runtime, read as that runtime reads it: one absolute
    host path per line, each mounted read-only at the same path where no Ascend CDI spec
    exists, besides the `ascend` directories."""

    mount_list: str = setting(
        "/etc/ascend-docker-runtime.d/base.list",
        "Ascend Docker Runtime's default mount list (written by its installer); used when it "
        "exists and is root's; empty: none.",
        checks.path_or_empty,
    )
    allowed: tuple[str, ...] = setting(
        (
            "/usr/local/Ascend/",
            "/usr/local/dcmi/",
            "/usr/local/bin/npu-smi",
            "/usr/local/sbin/npu-smi",
            "/etc/ascend_install.info",
            "/etc/hccn.conf",
            "/etc/sys_version.conf",
        ),
        "What the list may mount, as written and with links resolved: a path ending in / "
        "allows that directory and everything under it, any other path only itself. "
        "System directories (/, /etc, /proc, /sys, /dev, /run, /root, /home, /var/lib, ...) "
        "are refused whatever this says.",
        checks.path_list,
    )
