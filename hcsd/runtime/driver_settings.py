"""`[runtime.driver_paths.nvidia_files]`: how hcsd finds the NVIDIA driver's files on a host
without a vendor CDI spec, the way libnvidia-container does (docs/runtime.md, Driver files).

The lists are libnvidia-container's for the `compute` and `utility` capabilities (its
`src/nvc_info.c`: `compute_libs`, `utility_libs`, `compute_bins`, `utility_bins`); its
graphics, video and display sets are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from hcsd.model import Vendor
from hcsd.sections import Section, checks, setting

__all__ = ["AscendDriverFiles", "LibraryPaths", "NvidiaDriverFiles"]

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


@dataclass(frozen=True, slots=True)
class NvidiaDriverFiles(Section):
    """The NVIDIA driver's libraries (from the ld.so cache), tools and GSP firmware, mounted
    file by file and read-only where no NVIDIA CDI spec exists. Only root-owned regular files
    that no group or other user may write are mounted, and libraries only from the listed
    directories: a cache entry pointing anywhere else is skipped."""

    discover: bool = setting(
        True, "Look for the driver's files (false: only the directories in nvidia).", checks.boolean
    )
    driver_root: str = setting(
        "/",
        "Where the host's file system is (as nvidia-ctk's --driver-root): the cache, the "
        "directories and the files below are looked up under it.",
        checks.path,
    )
    ld_cache: str = setting("/etc/ld.so.cache", "The ld.so cache to read.", checks.path)
    library_dirs: tuple[str, ...] = setting(
        (
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
            "/usr/lib64",
            "/usr/lib",
            "/lib64",
            "/usr/local/nvidia/lib64",
        ),
        "Directories a library may be in (after resolving links); any other is refused.",
        checks.path_list,
    )
    libraries: tuple[str, ...] = setting(
        COMPUTE_LIBRARIES + UTILITY_LIBRARIES,
        "Library names looked up in the cache (a name matches itself and name.*).",
        checks.string_list,
    )
    binary_dirs: tuple[str, ...] = setting(
        ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"),
        "Where the tools are looked for, in order (libnvidia-container searches PATH).",
        checks.path_list,
    )
    binaries: tuple[str, ...] = setting(
        BINARIES, "The driver's tools, mounted at /usr/bin/NAME.", checks.string_list
    )
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
    firmware: bool = setting(
        True,
        "Mount /lib/firmware/nvidia/VERSION (the GSP firmware of libcuda's version) where it "
        "exists, as libnvidia-container does.",
        checks.boolean,
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
