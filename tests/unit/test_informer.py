"""The informer (list, then watch) against the list/watch protocol served over real HTTP.

The server (`watchserver.py`) keeps versions like kube-apiserver and lets each test close
watches, compact history, break frames and fail requests on purpose; the end-to-end path
against the real kube-apiserver is covered by tests/cluster (the extender's four informers).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from hcsd.cluster.informer import Informer
from tests.harness.waiting import wait_for
from tests.unit.watchserver import PATH, WatchServer

Change = tuple[str, Any, Any]


def size_of(obj: Mapping[str, Any]) -> int:
    """The transform under test: keep one field; a malformed object raises ValueError."""
    size = (obj.get("spec") or {}).get("size")
    if not isinstance(size, int):
        raise ValueError(f"spec.size must be a number, got {size!r}")
    return size


@pytest.fixture
def server() -> Iterator[WatchServer]:
    s = WatchServer()
    yield s
    s.close()


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.changes: list[Change] = []

    def __call__(self, key: str, old: Any, new: Any) -> None:
        with self.lock:
            self.changes.append((key, old, new))

    def since(self, start: int) -> list[Change]:
        with self.lock:
            return self.changes[start:]


@pytest.fixture
def started(server: WatchServer) -> Iterator[tuple[Informer[int], Recorder]]:
    recorder = Recorder()
    informer = Informer(server.kube(), PATH, size_of, name="things", on_change=recorder)
    yield informer, recorder
    informer.stop()
    server.close_watches()


def test_lists_in_pages_then_follows_the_watch(
    server: WatchServer, started: tuple[Informer[int], Recorder]
) -> None:
    for i in range(1234):
        server.put(f"t{i:04d}", spec={"size": i})
    informer, recorder = started
    informer.start()
    assert informer.synced.wait(10)
    assert len(informer.items) == 1234 and informer.items["test/t0042"] == 42
    lists = [q for kind, q in server.requests if kind == "list"]
    assert [q.get("continue", "") for q in lists] == ["", "500", "1000"]
    wait_for(lambda: server.count("watch") == 1, interval=0.01)
    assert server.requests[-1][1]["resourceVersion"] == "1234"  # the list's version
    mark = len(recorder.changes)
    server.put("t0001", spec={"size": 100})
    server.put("new", spec={"size": 7})
    server.delete("t0002")
    wait_for(lambda: len(recorder.since(mark)) == 3, interval=0.01)
    assert recorder.since(mark) == [
        ("test/t0001", 1, 100),
        ("test/new", None, 7),
        ("test/t0002", 2, None),
    ]
    assert "test/t0002" not in informer.items and informer.events == 3


def test_a_closed_watch_resumes_from_its_last_version_without_listing(
    server: WatchServer, started: tuple[Informer[int], Recorder]
) -> None:
    server.put("a", spec={"size": 1})
    informer, _ = started
    informer.start()
    wait_for(lambda: server.count("watch") == 1, interval=0.01)
    mark = server.bookmark()  # skipped, but its version is where the next watch starts
    server.put("b", spec={"size": 2})
    wait_for(lambda: "test/b" in informer.items, interval=0.01)
    assert informer.events == 1
    server.close_watches()  # as kube-apiserver does when timeoutSeconds runs out
    wait_for(lambda: server.count("watch") == 2, interval=0.01)
    assert server.requests[-1][1]["resourceVersion"] == str(mark + 1)
    assert server.count("list") == 1


@pytest.mark.parametrize("how", ["error-event", "http-status"])
def test_gone_lists_again_and_drops_what_vanished_meanwhile(
    server: WatchServer,
    started: tuple[Informer[int], Recorder],
    how: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server.put("stays", spec={"size": 1})
    server.put("goes", spec={"size": 2})
    informer, recorder = started
    informer.start()
    wait_for(lambda: server.count("watch") == 1, interval=0.01)
    mark = len(recorder.changes)
    if how == "http-status":
        server.fail.append(("watch", 410))
    with caplog.at_level(logging.WARNING, "hcsd.cluster.informer"):
        server.change_unseen({"came": {"spec": {"size": 3}}}, ["goes"])
        wait_for(lambda: server.count("list") == 2 and "test/came" in informer.items, interval=0.01)
    assert not caplog.text  # an expected turn of the protocol: no warning, no backoff
    assert sorted(informer.items) == ["test/came", "test/stays"]
    changes = recorder.since(mark)
    assert ("test/goes", 2, None) in changes and ("test/came", None, 3) in changes


def test_an_unreachable_server_is_retried_with_backoff(
    server: WatchServer, started: tuple[Informer[int], Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    server.put("a", spec={"size": 1})
    server.fail += [("list", 500), ("list", 500)]
    informer, _ = started
    with caplog.at_level(logging.WARNING, "hcsd.cluster.informer"):
        informer.start()
        assert informer.synced.wait(10)
    assert server.count("list") == 3 and informer.items == {"test/a": 1}
    assert "things: 500 InternalError" in caplog.text and "retrying in" in caplog.text


def test_a_malformed_object_is_skipped_and_the_cache_goes_on(
    server: WatchServer, started: tuple[Informer[int], Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    server.put("bad-at-list", spec={"size": "big"})
    informer, _ = started
    with caplog.at_level(logging.WARNING, "hcsd.cluster.informer"):
        informer.start()
        wait_for(lambda: server.count("watch") == 1, interval=0.01)
        server.put("bad-at-watch", spec={})
        server.put("good", spec={"size": 5})
        wait_for(lambda: "test/good" in informer.items, interval=0.01)
    assert informer.items == {"test/good": 5}
    assert "things: ignoring test/bad-at-list: spec.size must be a number" in caplog.text
    assert "things: ignoring test/bad-at-watch" in caplog.text


def test_a_broken_frame_lists_again(
    server: WatchServer, started: tuple[Informer[int], Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    server.put("a", spec={"size": 1})
    informer, _ = started
    with caplog.at_level(logging.WARNING, "hcsd.cluster.informer"):
        informer.start()
        wait_for(lambda: server.count("watch") == 1, interval=0.01)
        server.inject(b'{"type": "ADDED", "object": {"metadata"\n')
        wait_for(lambda: server.count("list") == 2, interval=0.01)
    assert "things: bad watch frame" in caplog.text
    wait_for(lambda: server.count("watch") == 2, interval=0.01)
    server.put("b", spec={"size": 2})
    wait_for(lambda: "test/b" in informer.items, interval=0.01)
