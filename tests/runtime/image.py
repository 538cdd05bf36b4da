"""Container images for the runtime tests, built locally as OCI image-layout tarballs.

No registry is reachable from the test machines, so the images are written with the standard
library from Debian's busybox-static: one uncompressed layer holding /bin/busybox, its applet
links, /etc/passwd and /etc/group. `ctr -n k8s.io images import` reads the tarball; the
`io.containerd.image.name` annotation names the image. The tarballs are reproducible (fixed
mtimes and owners) and cached under ~/.cache/hcs/images by a hash of what goes in, so a new
busybox or a change here builds a new one. `ensure_image` writes other images the same way,
with files of their own beside busybox (or instead of it, for an image that only carries files,
as the code layer of an image volume).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import struct
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.harness.peers.building import CACHE

BUSYBOX = Path("/bin/busybox")
BUSYBOX_IMAGE = "docker.io/hcs/busybox:test"
PAUSE_IMAGE = "docker.io/hcs/pause:test"
IMAGES = CACHE / "images"
APPLETS = (
    "sh", "cat", "ls", "env", "sleep", "stat", "echo", "true", "false", "test", "grep", "id",
    "mkdir", "rm", "touch", "head", "tail", "wc", "ps", "kill", "readlink", "printf", "uname",
    "mount", "hostname",
)  # fmt: skip
# PID 1 ignores TERM unless it traps it; `wait` returns at once on a trapped signal, where a
# foreground `sleep` would hold the exit back until it ends.
PAUSE_COMMAND = ["sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FORMAT = 1  # bump when the layout written here changes
MTIME = 1_700_000_000
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}


class ImageError(Exception):
    """The image cannot be built here (busybox-static missing)."""


def _entry(
    tar: tarfile.TarFile,
    name: str,
    data: bytes = b"",
    *,
    mode: int = 0o644,
    kind: bytes = tarfile.REGTYPE,
    link: str = "",
) -> None:
    info = tarfile.TarInfo(name)
    info.mode, info.type, info.linkname, info.mtime = mode, kind, link, MTIME
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


@dataclass(frozen=True)
class File:
    """One more entry of an image's layer: a regular file, or a symbolic link to `link`."""

    data: bytes = b""
    mode: int = 0o644
    link: str = ""


BASE_DIRECTORIES = ("bin", "dev", "etc", "proc", "root", "run", "sys", "usr", "var")


def _parents(paths: list[str], made: set[str]) -> list[str]:
    """The directories the paths need that are not in `made`, parents first."""
    needed = {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 1)}
    return sorted(needed - made, key=lambda d: d.split("/"))


def layer(busybox: bytes | None, files: Mapping[str, File] | None = None) -> bytes:
    """The image's only layer: an uncompressed tar of a minimal busybox root (none when
    `busybox` is None) plus `files` (paths relative to the root), their directories made."""
    files = files or {}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        made: set[str] = set()
        if busybox is not None:
            for directory in BASE_DIRECTORIES:
                _entry(tar, directory, mode=0o755, kind=tarfile.DIRTYPE)
            _entry(tar, "tmp", mode=0o1777, kind=tarfile.DIRTYPE)
            made = {*BASE_DIRECTORIES, "tmp"}
            _entry(tar, "bin/busybox", busybox, mode=0o755)
            for applet in APPLETS:
                _entry(tar, f"bin/{applet}", kind=tarfile.SYMTYPE, link="busybox")
            _entry(tar, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:\n")
            _entry(tar, "etc/group", b"root:x:0:\nnogroup:x:65534:\n")
        for directory in _parents(sorted(files), made):
            _entry(tar, directory, mode=0o755, kind=tarfile.DIRTYPE)
        for path in sorted(files):
            f = files[path]
            if f.link:
                _entry(tar, path, kind=tarfile.SYMTYPE, link=f.link)
            else:
                _entry(tar, path, f.data, mode=f.mode)
    return buffer.getvalue()


def _blob(tar: tarfile.TarFile, document: bytes) -> dict[str, object]:
    digest = hashlib.sha256(document).hexdigest()
    _entry(tar, f"blobs/sha256/{digest}", document)
    return {"digest": f"sha256:{digest}", "size": len(document)}


def _json(document: object) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def oci_layout(
    name: str,
    command: list[str],
    busybox: bytes | None,
    files: Mapping[str, File] | None = None,
    env: tuple[str, ...] = (),
) -> bytes:
    """An OCI image-layout tarball of `name` whose default command is `command` (none when
    empty), with `files` in its layer and `env` after PATH in its configuration."""
    layer_bytes = layer(busybox, files)
    arch = ARCHITECTURES.get(platform.machine(), platform.machine())
    config = _json(
        {
            "architecture": arch,
            "os": "linux",
            "config": {
                **({"Cmd": command} if command else {}),
                "Env": [PATH_ENV, *env],
                "WorkingDir": "/",
            },
            "rootfs": {
                "type": "layers",
                "diff_ids": ["sha256:" + hashlib.sha256(layer_bytes).hexdigest()],
            },
        }
    )
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _entry(tar, "blobs", mode=0o755, kind=tarfile.DIRTYPE)
        _entry(tar, "blobs/sha256", mode=0o755, kind=tarfile.DIRTYPE)
        layer_ref = _blob(tar, layer_bytes)
        config_ref = _blob(tar, config)
        manifest = _json(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_ref},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer_ref}],
            }
        )
        manifest_ref = _blob(tar, manifest)
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    **manifest_ref,
                    "platform": {"architecture": arch, "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                    },
                }
            ],
        }
        _entry(tar, "index.json", _json(index))
        _entry(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
    return buffer.getvalue()


def is_static_elf(binary: bytes) -> bool:
    """True for an ELF64 executable without an interpreter (PT_INTERP): it runs in an image
    that has no libc. Debian's `busybox` package is dynamic; `busybox-static` is not."""
    if binary[:4] != b"\x7fELF" or binary[4] != 2:
        return False
    order = "<" if binary[5] == 1 else ">"
    (table,) = struct.unpack_from(order + "Q", binary, 0x20)
    size, count = struct.unpack_from(order + "HH", binary, 0x36)
    pt_interp = 3
    return all(
        struct.unpack_from(order + "I", binary, table + i * size)[0] != pt_interp
        for i in range(count)
    )


def _busybox() -> bytes:
    if not BUSYBOX.exists():
        raise ImageError(f"{BUSYBOX} is missing (apt install busybox-static)")
    busybox = BUSYBOX.read_bytes()
    if not is_static_elf(busybox):
        raise ImageError(f"{BUSYBOX} is dynamically linked (apt install busybox-static)")
    return busybox


def ensure_image(
    stem: str,
    name: str,
    command: list[str],
    files: Mapping[str, File] | None = None,
    *,
    env: tuple[str, ...] = (),
    with_busybox: bool = True,
) -> Path:
    """Build the image once per content and layout format; reuse the cached tarball."""
    busybox = _busybox() if with_busybox else None
    files = files or {}
    described = [FORMAT, name, command, APPLETS] if not files and not env else [
        FORMAT, name, command, APPLETS, list(env),
        sorted((p, f.mode, f.link, hashlib.sha256(f.data).hexdigest()) for p, f in files.items()),
    ]  # fmt: skip
    key = hashlib.sha256(_json(described) + (busybox or b"")).hexdigest()[:16]
    path = IMAGES / f"{stem}-{key}.tar"
    if path.exists():
        return path
    IMAGES.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_bytes(oci_layout(name, command, busybox, files, env))
    partial.rename(path)  # atomic: a concurrent worker sees a whole tarball or none
    return path


def ensure_busybox_image() -> Path:
    """`docker.io/hcs/busybox:test`: the image test containers run (default command `sh`)."""
    return ensure_image("busybox", BUSYBOX_IMAGE, ["sh"])


def ensure_pause_image() -> Path:
    """`docker.io/hcs/pause:test`: the sandbox image, a shell that sleeps until TERM."""
    return ensure_image("pause", PAUSE_IMAGE, PAUSE_COMMAND)
