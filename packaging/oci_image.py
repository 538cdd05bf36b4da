"""Write an OCI image-layout tarball of one layer from chosen paths of a root (make image).

Ours rather than umoci or skopeo: neither builds a layer from a list of paths with clamped
times and numeric owners in one step (umoci repacks a whole unpacked bundle and records
times; skopeo only copies images), and an exact, reproducible writer is ~150 lines of tarfile
and hashlib. Reproducible: entries in path order, parents first; owners numeric with no
names; mtimes clamped to SOURCE_DATE_EPOCH; hard links as links to the first name; gzip with
no name and time 0; JSON with sorted keys. Same root and epoch, same bytes, same digest.

Usage: oci_image.py --root DIR --name REF --version V --seeds FILE --output PATH
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import stat
import sys
import tarfile
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import image_files

USER = "65532:65532"  # nonroot (image_files adds it to /etc/passwd and /etc/group)
PATH = "/opt/hcsd/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MEDIA = "application/vnd.oci.image"


def _json(document: object) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def _info(root: Path, path: str, epoch: int, seen: dict[tuple[int, int], str]) -> tarfile.TarInfo:
    """The tar header of `path` as it is in `root`, owner numeric, time clamped."""
    st = os.lstat(root / path.lstrip("/"))
    info = tarfile.TarInfo(path.lstrip("/"))
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid, info.uname, info.gname = st.st_uid, st.st_gid, "", ""
    info.mtime = min(int(st.st_mtime), epoch)
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(root / path.lstrip("/"))
    elif stat.S_ISREG(st.st_mode):
        first = seen.setdefault((st.st_dev, st.st_ino), info.name) if st.st_nlink > 1 else None
        if first is not None and first != info.name:
            info.type, info.linkname = tarfile.LNKTYPE, first
        else:
            info.size = st.st_size
    else:
        raise ValueError(f"{path}: not a file, directory or symlink (mode {st.st_mode:o})")
    return info


def layer(root: Path, paths: list[str], epoch: int, extra: dict[str, bytes]) -> bytes:
    """The uncompressed layer: `paths` of `root` with their parents, plus `extra` files."""
    every = set(paths) | set(extra)
    for path in list(every):
        parent = os.path.dirname(path)
        while parent not in ("/", ""):
            every.add(parent)
            parent = os.path.dirname(parent)
    buffer = io.BytesIO()
    seen: dict[tuple[int, int], str] = {}
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(every, key=lambda p: p.split("/")):
            if path in extra:
                info = tarfile.TarInfo(path.lstrip("/"))
                info.mode, info.mtime, info.size = 0o644, epoch, len(extra[path])
                tar.addfile(info, io.BytesIO(extra[path]))
                continue
            info = _info(root, path, epoch, seen)
            if info.isreg():
                with open(root / path.lstrip("/"), "rb") as content:
                    tar.addfile(info, content)
            else:
                tar.addfile(info)
    return buffer.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes, epoch: int) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.mode, info.mtime, info.size = 0o644, epoch, len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"digest": f"sha256:{digest}", "size": len(data)}


HCS_LABELS = {
    "org.opencontainers.image.title": "hcs-cluster",
    "org.opencontainers.image.description": "HCS cluster side: hcs-syncer, "
    "hcs-scheduler-extender and the package's other programs",
    "org.opencontainers.image.licenses": "Apache-2.0",
}


def image(
    layer_tar: bytes,
    name: str,
    version: str,
    epoch: int,
    *,
    labels: dict[str, str] | None = None,
    cmd: tuple[str, ...] = ("hcs-syncer", "--help"),
) -> bytes:
    """The OCI layout tarball: index.json naming `name`, the manifest, config and layer.
    `labels` and `cmd` default to HCS's image's (the test harness writes other images)."""
    compressed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, mtime=0) as gz:
        gz.write(layer_tar)
    created = datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    labels = {**(HCS_LABELS if labels is None else labels),
              "org.opencontainers.image.version": version}  # fmt: skip
    config = _json({
        "architecture": "amd64", "os": "linux", "created": created,
        "config": {
            "User": USER, "Env": [f"PATH={PATH}", "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1"],
            "Cmd": list(cmd), "WorkingDir": "/", "Labels": labels,
        },
        "rootfs": {"type": "layers",
                   "diff_ids": ["sha256:" + hashlib.sha256(layer_tar).hexdigest()]},
        "history": [{"created": created, "created_by": "packaging/build-image (make image)"}],
    })  # fmt: skip
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, epoch
            tar.addfile(info)
        layer_ref = _blob(tar, compressed.getvalue(), epoch)
        config_ref = _blob(tar, config, epoch)
        manifest = _json({
            "schemaVersion": 2, "mediaType": f"{MEDIA}.manifest.v1+json",
            "config": {"mediaType": f"{MEDIA}.config.v1+json", **config_ref},
            "layers": [{"mediaType": f"{MEDIA}.layer.v1.tar+gzip", **layer_ref}],
        })  # fmt: skip
        manifest_ref = _blob(tar, manifest, epoch)
        index = _json({
            "schemaVersion": 2, "mediaType": f"{MEDIA}.index.v1+json",
            "manifests": [{
                "mediaType": f"{MEDIA}.manifest.v1+json", **manifest_ref,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {"io.containerd.image.name": name,
                                "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
            }],
        })  # fmt: skip
        for file_name, data in (("oci-layout", _json({"imageLayoutVersion": "1.0.0"})),
                                ("index.json", index)):  # fmt: skip
            info = tarfile.TarInfo(file_name)
            info.mode, info.mtime, info.size = 0o644, epoch, len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--name", required=True, help="e.g. docker.io/hcs/hcs-cluster:0.1.0")
    parser.add_argument("--version", required=True)
    parser.add_argument("--seeds", type=Path, required=True, help="more packages, one a line")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    epoch = int(os.environ["SOURCE_DATE_EPOCH"])
    paths, status = image_files.select(args.root, args.seeds.read_text().split())
    layer_tar = layer(args.root, paths, epoch, {"/var/lib/dpkg/status": status.encode()})
    args.output.write_bytes(image(layer_tar, args.name, args.version, epoch))
    print(f"image: {len(paths)} paths, layer {len(layer_tar)} bytes uncompressed")


if __name__ == "__main__":
    main()
