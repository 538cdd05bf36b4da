"""OCI image-layout tarballs built locally (no registry is reachable): busybox-static with its
applets, importable with `ctr images import`. Two images: a shell image for test containers
and a pause stand-in (a shell that sleeps and exits on TERM) for pod sandboxes."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "cat", "stat", "ls", "env", "sleep", "echo", "true", "test")
SHELL_IMAGE = "docker.io/hcs/busybox:test"
PAUSE_IMAGE = "docker.io/hcs/pause:test"


def _add(
    tar: tarfile.TarFile,
    name: str,
    data: bytes = b"",
    *,
    mode: int = 0o644,
    kind: bytes = tarfile.REGTYPE,
    link: str = "",
) -> None:
    info = tarfile.TarInfo(name)
    info.mode, info.type, info.linkname, info.size = mode, kind, link, len(data)
    tar.addfile(info, io.BytesIO(data) if data else None)


def _layer() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("bin", "etc", "dev", "proc", "sys", "tmp", "run"):
            _add(tar, directory, mode=0o755, kind=tarfile.DIRTYPE)
        _add(tar, "bin/busybox", BUSYBOX.read_bytes(), mode=0o755)
        for applet in APPLETS:
            _add(tar, f"bin/{applet}", kind=tarfile.SYMTYPE, link="busybox")
        _add(tar, "etc/passwd", b"root:x:0:0:root:/:/bin/sh\n")
        _add(tar, "etc/group", b"root:x:0:\n")
    return buffer.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    _add(tar, f"blobs/sha256/{digest}", data)
    return f"sha256:{digest}", len(data)


def build_image(path: Path, name: str, command: list[str]) -> Path:
    """Write an OCI layout tarball for `name` running `command` (cached by path)."""
    if path.exists():
        return path
    layer = _layer()
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Cmd": command, "Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    ).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        layer_digest, layer_size = _blob(tar, layer)
        config_digest, config_size = _blob(tar, config)
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": config_digest,
                    "size": config_size,
                },
                "layers": [
                    {
                        "mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": layer_digest,
                        "size": layer_size,
                    }
                ],
            }
        ).encode()
        manifest_digest, manifest_size = _blob(tar, manifest)
        index = json.dumps(
            {
                "schemaVersion": 2,
                "manifests": [
                    {
                        "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": manifest_digest,
                        "size": manifest_size,
                        "annotations": {
                            "io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": "test",
                        },
                    }
                ],
            }
        ).encode()
        _add(tar, "index.json", index)
        _add(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return path
