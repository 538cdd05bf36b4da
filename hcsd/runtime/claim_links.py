"""Which containers belong to which DRA claim, learned when the runtime creates them.

A claim is prepared before any of its containers exists (docs/dra.md, "Prepare"), so its
ledger record names no container and the VRAM watchdog could not charge a process to it. The
NRI plugin sees every container at CreateContainer with its mounts as the runtime resolved
them, CDI edits included: a container whose quota file at `/run/hcs/quota.conf` is the bind
of `<run_dir>/claims/claim-<uid>/quota.conf` got it from the claim's CDI spec, which kubelet
names only for containers that reference the claim. A pod cannot name that source itself
short of a hostPath volume of hcsd's run directory (which already gives it everything), and
neither its env nor its annotations count: both are the tenant's to write.

At the same moment the claim's usage region gets the container's user as its owner (0644),
as an extender-mode container's region does, when the runtime says who the container runs
as. The containers of one claim share its region (the claim is the unit of quota), so a second
container running as another user turns it back to root's 0666, writable by every uid in
them, with a warning: the fallback a container of unknown user gets in extender mode too.

The links live in memory: after a restart of hcsd the NRI Synchronize lists the running
containers with their mounts again (`reconcile`).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable, Mapping

from hcsd.contract import paths
from hcsd.runtime.claims import CLAIM_SOURCE
from hcsd.runtime.container_files import (
    ANY_WRITER,
    QUOTA_FILE,
    READABLE,
    REGION_FILE,
    ContainerUser,
    QuotaFiles,
)
from hcsd.runtime.container_info import ContainerInfo
from hcsd.runtime.dirfd import opened_dir
from hcsd.service import NodeService

__all__ = ["ClaimLinks"]

log = logging.getLogger(__name__)


class ClaimLinks:
    def __init__(self, service: NodeService, claim_files: QuotaFiles) -> None:
        self.service = service
        self.files = claim_files  # the `claims` QuotaFiles the claims are prepared with
        self._links: dict[str, str] = {}  # container id -> claim key

    def members(self) -> Mapping[str, str]:
        """Container id -> the ledger key of its claim (a copy: the watchdog's snapshot)."""
        return dict(self._links)

    def claim_of(self, info: ContainerInfo) -> str | None:
        """The key of the held claim whose quota file the container mounts, if any."""
        for mount in info.mounts:
            if mount.destination != paths.CONTAINER_QUOTA_FILE or not mount.bind:
                continue
            directory, name = os.path.split(mount.source)
            root, key = os.path.split(directory)
            if name != QUOTA_FILE or root != self.files.root:
                continue
            held = self.service.allocation(key)
            if held is not None and held.source == CLAIM_SOURCE:
                return key
        return None

    def link(self, info: ContainerInfo) -> str | None:
        """Record the container as its claim's, and give the claim's region to its user."""
        key = self.claim_of(info)
        if key is None:
            return None
        if self._links.get(info.container_id) != key:
            log.info("%s: uses %s (VRAM watched against the claim)", info.label, key)
        self._links[info.container_id] = key
        try:
            self._own_region(key, info)
        except OSError as e:
            log.warning("%s: cannot set the owner of %s's usage region: %s", info.label, key, e)
        return key

    def unlink(self, container_id: str) -> None:
        self._links.pop(container_id, None)

    def reconcile(self, running: Iterable[ContainerInfo]) -> None:
        """The links of the containers the runtime lists now (after hcsd or the runtime
        restarted); regions keep the owners they were given."""
        self._links = {}
        for info in running:
            if (key := self.claim_of(info)) is not None:
                self._links[info.container_id] = key

    def _own_region(self, key: str, info: ContainerInfo) -> None:
        """The region becomes the container's user's, 0644, when it is still as prepared
        (root's 0666, no other container linked) or already that user's; root's 0666 when
        the user is unknown or another container of the claim runs as someone else."""
        user = info.user
        with (
            opened_dir(self.files.root, follow=True) as root_fd,
            opened_dir(key, root_fd) as dir_fd,
        ):
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(REGION_FILE, flags, dir_fd=dir_fd)
            try:
                now = os.fstat(fd)
                if not stat.S_ISREG(now.st_mode):
                    raise OSError(f"{REGION_FILE} is not a regular file")
                owner = ContainerUser(now.st_uid, now.st_gid)
                shared = now.st_mode & 0o777 == ANY_WRITER
                fresh = shared and not self._others(key, info.container_id)
                if user is not None and (fresh or (not shared and owner == user)):
                    if shared:  # the mode first: hcsd, without CAP_FOWNER, may change
                        os.fchmod(fd, READABLE)  # it only while the file is its own
                    if owner != user:
                        os.fchown(fd, user.uid, user.gid)
                    return
                if not shared:
                    log.warning(
                        "%s: runs as %s, another container of %s as uid %d gid %d: the "
                        "claim's usage region is now writable by every uid in them",
                        info.label,
                        "an unknown user" if user is None else f"uid {user.uid} gid {user.gid}",
                        key,
                        owner.uid,
                        owner.gid,
                    )
                    os.fchown(fd, 0, 0)
                os.fchmod(fd, ANY_WRITER)
            finally:
                os.close(fd)

    def _others(self, key: str, container_id: str) -> bool:
        """Whether a container of the claim other than this one is linked."""
        return any(k == key and c != container_id for c, k in self._links.items())
