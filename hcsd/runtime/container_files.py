"""The files libhcs reads in a container: `quota.conf`, the usage region, the preload file.

Host side, per container, `<run_dir>/containers/<container-id>/` holds `quota.conf` and
`usage.shm`; the container gets each as its own bind mount, never the directory:
- `quota.conf` read-only at `/run/hcs/quota.conf` (the fixed path libhcs reads);
- `usage.shm`, the usage region libhcs maps (hcsd.contract.region), read-write at
  `/run/hcs/usage.shm`, beside it as libhcs expects. hcsd writes the empty region before the
  container starts, owned by the container's user, so a non-root container needs no right to
  create files and no container process ever initialises (or re-initialises) it.
Node-wide, `<run_dir>/ld.so.preload` (naming libhcs) is bind-mounted read-only over the
container's `/etc/ld.so.preload`, and libhcs itself read-only at `/usr/lib/hcs/libhcs.so`.

Everything a container reads is world-readable (0644): glibc skips a preload file it cannot
read without a word, and libhcs would never load in a non-root container. Nothing in these
files is secret. The region is 0644 too, owned by the container's uid and gid: only the
container's user (and its root) writes it, and hcsd, which has no CAP_DAC_OVERRIDE, can read
the totals for the watchdog. When the runtime does not say who the container runs as (NRI
before v0.12, a user namespace whose mapping the request does not carry), the region is
root's and 0666, which any uid in the container can write.

Every operation in these directories goes through directory descriptors (hcsd.runtime.dirfd):
their contents may come from a container (an older hcsd mounted the whole directory), and a
planted link must not turn a write into one of hcsd's own files. The file format of quota.conf
is the contract in docs/libhcs.md, written by hcsd.contract.quota_file.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from hcsd.contract import paths, region
from hcsd.contract.names import CONTAINER_ID
from hcsd.contract.quota_file import render_quota
from hcsd.model import Device, Grant
from hcsd.runtime.dirfd import Owner, opened_dir, read_file, remove_tree, write_file
from hcsd.runtime.edits import ContainerEdits, MountEdit

__all__ = ["LIBHCS_IN_CONTAINER", "ContainerUser", "QuotaFiles"]

log = logging.getLogger(__name__)

LIBHCS_IN_CONTAINER = paths.LIBHCS_IN_CONTAINER
QUOTA_FILE = "quota.conf"
REGION_FILE = "usage.shm"
READABLE = 0o644  # what every process of the container reads
ANY_WRITER = 0o666  # the region when the container's user is not known
DIRECTORY = 0o711  # hcsd's; the runtime resolves mount sources, nobody lists them
PRELOAD_TEXT = f"{LIBHCS_IN_CONTAINER}\n".encode()


@dataclass(frozen=True, slots=True)
class ContainerUser:
    """The uid and gid a container's processes run as, on the host (after any user
    namespace's mapping): who owns its usage region."""

    uid: int
    gid: int


class QuotaFiles:
    def __init__(self, run_dir: str, libhcs_path: str, kind: str = "containers") -> None:
        """`kind`: the directory under `run_dir` holding one directory per holder
        (`containers`; `claims` for DRA claims, kept apart so that the NRI reconcile, which
        removes the directories of containers the runtime no longer has, never sees them)."""
        self.run_dir = run_dir
        self.kind = kind
        self.root = os.path.join(run_dir, kind)
        self.libhcs_path = libhcs_path
        self.preload_file = os.path.join(run_dir, "ld.so.preload")

    def directory(self, container_id: str) -> str:
        if not CONTAINER_ID.fullmatch(container_id):
            raise ValueError(f"container id {container_id!r} is not a safe directory name")
        return os.path.join(self.root, container_id)

    def quota_file(self, container_id: str) -> str:
        """The host path of a container's quota file (its mount source); "" for an id that
        names no directory of hcsd's."""
        if not CONTAINER_ID.fullmatch(container_id):
            return ""
        return os.path.join(self.root, container_id, QUOTA_FILE)

    def prepare(
        self,
        container_id: str,
        grants: Sequence[Grant],
        devices: Sequence[Device],
        user: ContainerUser | None = None,
    ) -> ContainerEdits:
        """Write the quota file and the usage region, and return the edits that expose them."""
        if not os.path.isfile(self.libhcs_path):
            # Refuse now with the reason, rather than hand the runtime a mount that fails at
            # start with a bare stat error, or run the container without its quota.
            raise FileNotFoundError(
                f"libhcs is not installed at {self.libhcs_path}; the VRAM quota cannot be enforced"
            )
        directory = self.directory(container_id)
        text = render_quota(container_id, grants, devices).encode()
        os.makedirs(self.run_dir, mode=0o755, exist_ok=True)
        with (
            opened_dir(self.run_dir, follow=True) as run_fd,
            opened_dir(self.kind, run_fd, create=DIRECTORY) as root_fd,
            opened_dir(container_id, root_fd, create=DIRECTORY) as fd,
        ):
            write_file(fd, QUOTA_FILE, text, mode=READABLE)
            self._region(fd, container_id, user)
        preload = self.preload_edits()
        return ContainerEdits(
            env=(("HCS_CONFIG", paths.CONTAINER_QUOTA_FILE),),
            mounts=(
                MountEdit(os.path.join(directory, QUOTA_FILE), paths.CONTAINER_QUOTA_FILE),
                MountEdit(
                    os.path.join(directory, REGION_FILE),
                    paths.CONTAINER_REGION_FILE,
                    read_only=False,
                ),
                *preload.mounts,
            ),
        )

    def _region(self, dir_fd: int, container_id: str, user: ContainerUser | None) -> None:
        """A fresh region, unless a usable one is there already: a container prepared again
        (a hook after the NRI plugin, a same-id restart) keeps the one its mount may hold."""
        existing = read_file(dir_fd, REGION_FILE, region.SIZE + 1)
        if existing is not None and region.problem(existing) is None:
            return
        owner = None if user is None else Owner(user.uid, user.gid)
        try:
            write_file(
                dir_fd,
                REGION_FILE,
                region.header(),
                size=region.SIZE,  # the rest is zeros: a sparse file, as libhcs makes one
                mode=READABLE if owner else ANY_WRITER,
                owner=owner,
            )
        except PermissionError:
            if owner is None:
                raise
            # Without CAP_CHOWN (a unit from before hcsd needed it) the region cannot be the
            # container's: any uid may write it rather than none but root.
            log.warning(
                "%s: cannot give the usage region to uid %d gid %d (hcsd lacks CAP_CHOWN); "
                "it is writable by every uid in the container",
                container_id,
                owner.uid,
                owner.gid,
            )
            write_file(dir_fd, REGION_FILE, region.header(), size=region.SIZE, mode=ANY_WRITER)

    def preload_edits(self) -> ContainerEdits:
        """libhcs and the preload file that loads it, read-only: the part of the quota edits
        that is the same for every container (the CDI spec's too). The preload file is
        rewritten whenever it is not exactly what hcsd writes (content and mode)."""
        os.makedirs(self.run_dir, mode=0o755, exist_ok=True)
        name = os.path.basename(self.preload_file)
        with opened_dir(os.path.dirname(self.preload_file), follow=True) as fd:
            if not self._preload_current(fd, name):
                write_file(fd, name, PRELOAD_TEXT, mode=READABLE)
        return ContainerEdits(
            mounts=(
                MountEdit(self.libhcs_path, LIBHCS_IN_CONTAINER),
                MountEdit(self.preload_file, paths.PRELOAD_FILE),
            )
        )

    @staticmethod
    def _preload_current(dir_fd: int, name: str) -> bool:
        if read_file(dir_fd, name, len(PRELOAD_TEXT) + 1) != PRELOAD_TEXT:
            return False
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return info.st_mode & 0o7777 == READABLE and info.st_uid == os.geteuid()

    def remove(self, container_id: str) -> bool:
        """Remove the container's directory, whatever is in it; False (and a warning naming
        what is left) when something cannot go. Never raises: one directory must not fail the
        reconcile or the removal of another."""
        if not CONTAINER_ID.fullmatch(container_id):
            return True  # never a directory of ours
        try:
            with (
                opened_dir(self.run_dir, follow=True) as run_fd,
                opened_dir(self.kind, run_fd) as root_fd,
            ):
                problems = remove_tree(root_fd, container_id)
        except FileNotFoundError:
            return True
        except OSError as e:
            problems = [f"{self.root}: {e.strerror}"]
        if problems:
            log.warning(
                "%s: cannot remove all of its quota directory, left: %s",
                container_id,
                "; ".join(problems[:5])
                + (f"; and {len(problems) - 5} more" if problems[5:] else ""),
            )
        return not problems

    def present(self) -> list[str]:
        """The container ids that have a directory (other names are not ours)."""
        with (
            contextlib.suppress(OSError),
            opened_dir(self.run_dir, follow=True) as run_fd,
            opened_dir(self.kind, run_fd) as fd,
        ):
            return sorted(n for n in os.listdir(fd) if CONTAINER_ID.fullmatch(n))
        return []
