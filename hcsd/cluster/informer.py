"""List-then-watch caches of API objects, one thread each.

The extender answers from memory: an informer lists a resource once, then follows its watch,
re-listing when the server says the version is gone (410) and backing off while the server
is away. Objects pass through `transform` first, which keeps only what the extender needs
(a ComputeNode becomes a NodeView; a pod without accelerators is dropped), so thousands of
objects cost little memory and no work at decision time.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from hcsd.cluster.kube import Kube, KubeError

__all__ = ["Informer"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


class Informer(Generic[T]):
    """A cache of `path`'s objects, transformed; `on_change(key, old, new)` after each event,
    `on_listed(started)` after each full list (everything not listed has been removed)."""

    def __init__(
        self,
        kube: Kube,
        path: str,
        transform: Callable[[Mapping[str, Any]], T | None],
        *,
        query: Sequence[tuple[str, str]] = (),
        on_change: Callable[[str, T | None, T | None], None] | None = None,
        on_listed: Callable[[float], None] | None = None,
        name: str = "",
    ) -> None:
        self.kube = kube
        self.path = path
        self.query = tuple(query)
        self.transform = transform
        self.on_change = on_change
        self.on_listed = on_listed  # after each full list: (monotonic time it was asked)
        self.name = name or path
        self.items: dict[str, T] = {}
        self.synced = threading.Event()
        self.lock = threading.Lock()
        self.events = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Informer[T]:
        self._thread = threading.Thread(target=self._run, name=f"informer {self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()

    def get(self, key: str) -> T | None:
        return self.items.get(key)

    def apply(self, key: str, new: T | None) -> None:
        """What one watch event does: keep `new` under `key` (None: the object is gone) and
        tell `on_change`. Public so that a cache can also be filled without a server."""
        with self.lock:
            old = self.items.pop(key, None) if new is None else self.items.get(key)
            if new is not None:
                self.items[key] = new
        if self.on_change is not None and (old is not None or new is not None):
            self.on_change(key, old, new)

    def _safe_transform(self, obj: Mapping[str, Any]) -> T | None:
        try:
            return self.transform(obj)
        except ValueError as e:  # a malformed object: skip it, say so, keep the cache going
            log.warning("%s: ignoring %s: %s", self.name, object_key(obj), e)
            return None

    def _relist(self) -> str:
        started = time.monotonic()
        objects, version = self.kube.list_all(self.path, self.query)
        fresh = {object_key(o): self._safe_transform(o) for o in objects}
        for key in list(self.items):
            if key not in fresh:
                self.apply(key, None)
        for key, value in fresh.items():
            self.apply(key, value)
        if self.on_listed is not None:
            self.on_listed(started)
        self.synced.set()
        return version

    def _run(self) -> None:
        failures = 0
        version = ""
        while not self._stopping.is_set():
            try:
                if not version:
                    version = self._relist()
                for event in self.kube.watch(self.path, version, query=self.query):
                    obj = event.get("object") or {}
                    version = str((obj.get("metadata") or {}).get("resourceVersion", version))
                    kind = event.get("type")
                    if kind == "BOOKMARK":
                        continue
                    self.events += 1
                    key = object_key(obj)
                    self.apply(key, None if kind == "DELETED" else self._safe_transform(obj))
                    if self._stopping.is_set():
                        return
                failures = 0
            except KubeError as e:
                if e.gone:
                    version = ""  # too old: list again
                    continue
                failures += 1
                version = ""
                delay = min(5.0, 0.25 * 2 ** min(failures, 6)) * random.uniform(0.5, 1.0)  # noqa: S311 - jitter
                if failures == 1 or failures % 10 == 0:
                    log.warning("%s: %s; retrying in %.1fs", self.name, e, delay)
                self._stopping.wait(delay)
            except ValueError as e:  # a broken frame from the server: start over
                log.warning("%s: bad watch frame (%s); listing again", self.name, e)
                version = ""
                time.sleep(0.5)
