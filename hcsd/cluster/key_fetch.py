"""hcs-syncer's part in key delivery: fetch this node's keys from the extender, give them to hcsd.

The syncer holds no key and mounts neither the Secret nor /etc/hcsd: it presents its
projected service-account token (audience `hcs-node-keys`, re-read at each fetch because
kubelet rotates it) to the extender's node-keys endpoint over HTTPS, and passes the answer,
unread, to hcsd's InstallKeys over the root-only API socket. hcsd checks that the keys are
its node's and stores them. A failure is logged and retried sooner than the usual interval.
"""

from __future__ import annotations

import logging
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from hcsd.api.client import ApiError, Client

__all__ = ["KeyFetchError", "KeyFetcher", "fetch"]

log = logging.getLogger(__name__)

MAX_ANSWER = 64 * 1024


class KeyFetchError(Exception):
    """The keys could not be fetched now (network, TLS, refused): try again later."""


def fetch(url: str, token: str, *, ca: str = "", timeout: float = 10.0) -> str:
    """The extender's answer for the token's node (the keyring JSON)."""
    if not url.startswith(("https://", "http://")):
        raise KeyFetchError(f"the node-keys URL must be https:// (or http:// in tests): {url}")
    context = ssl.create_default_context(cafile=ca or None) if url.startswith("https:") else None
    headers = {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - scheme checked above
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:  # noqa: S310
            data: bytes = answer.read(MAX_ANSWER + 1)
    except urllib.error.HTTPError as e:
        why = e.read(500).decode(errors="replace").strip()
        raise KeyFetchError(f"failed to fetch node keys: {e.code} {why}") from e
    except (urllib.error.URLError, OSError) as e:
        raise KeyFetchError(f"failed to fetch node keys from {url}: {e}") from e
    if len(data) > MAX_ANSWER:
        raise KeyFetchError(f"the node-keys answer is larger than {MAX_ANSWER} bytes")
    return data.decode(errors="replace")


class KeyFetcher:
    """`run_once` at `next_at`: the interval is `every`, a tenth of it after a failure."""

    def __init__(
        self,
        url: str,
        token_file: str,
        socket_path: str,
        *,
        ca: str = "",
        every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.token_file = token_file
        self.socket_path = socket_path
        self.ca = ca
        self.every = every
        self.clock = clock
        self.next_at = 0.0
        self.installed: tuple[str, ...] = ()  # the key ids hcsd holds, as it last said

    def run_once(self) -> bool:
        """Fetch and install; True when hcsd holds the keys now."""
        try:
            token = Path(self.token_file).read_text().strip()
            keyring = fetch(self.url, token, ca=self.ca)
            with Client(self.socket_path, timeout=10.0) as hcsd:
                answer = hcsd.install_keys(keyring)
        except (KeyFetchError, ApiError, OSError) as e:
            log.error("%s", e)
            self.next_at = self.clock() + max(1.0, self.every / 10)
            return False
        self.next_at = self.clock() + self.every
        ids = tuple(answer.key_ids)
        if answer.changed or ids != self.installed:
            log.info("hcsd holds assignment keys %s (signing %s)", ", ".join(ids), answer.signing)
        self.installed = ids
        return True
