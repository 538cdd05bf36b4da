"""hcsd's log lines: one record is one line whatever the text in it; bursts are bounded."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from hcsd.daemon.logs import configure_logging, escape_controls
from hcsd.logs import RepeatLimiter

FORGED = "llama\n<3>hcsd: ledger corrupt, wiping /var/lib/hcsd\r\x1b[2K"


@pytest.fixture
def root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("journal", [True, False], ids=["journald", "terminal"])
def test_control_characters_cannot_forge_a_line(
    journal: bool,
    root_logging: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if journal:
        monkeypatch.setenv("JOURNAL_STREAM", "8:1")
    else:
        monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    configure_logging("info")
    logging.getLogger("hcsd.runtime").warning("%s: models %r and %s", "ns/pod/c", "x", FORGED)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\r" not in err and "\x1b" not in err
    assert err.endswith(
        "ns/pod/c: models 'x' and llama\\n<3>hcsd: ledger corrupt, wiping /var/lib/hcsd"
        "\\r\\x1b[2K\n"
    )
    assert err.startswith("<4>ns/pod/c") if journal else " WARNING " in err


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        pytest.param("plain text, ünïcode", "plain text, ünïcode", id="untouched"),
        pytest.param("a\tb\x00c\x7f", "a\\tb\\x00c\\x7f", id="c0-and-del"),
        pytest.param("a\x85b\u2028c\u2029", "a\\x85b\\u2028c\\u2029", id="c1-and-separators"),
    ],
)
def test_escape_controls(text: str, escaped: str) -> None:
    assert escape_controls(text) == escaped


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def limited(clock: Clock) -> tuple[logging.Logger, list[str]]:
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Collect()
    handler.addFilter(RepeatLimiter(handler.handle, limit=3, interval=10.0, clock=clock))
    logger = logging.getLogger(f"test-limiter-{id(lines)}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.handlers[:] = [handler]
    return logger, lines


def test_a_repeated_message_is_bounded_and_summarised() -> None:
    clock = Clock()
    logger, lines = limited(clock)
    for _ in range(10_000):
        logger.error("socket.accept() out of system resource")
        clock.now += 0.0001
    logger.error("another message")
    assert lines == ["socket.accept() out of system resource"] * 3 + ["another message"]
    clock.now += 10
    logger.error("socket.accept() out of system resource")
    assert lines[4:] == [
        "suppressed 9997 repeat(s) in 11s of: socket.accept() out of system resource",
        "socket.accept() out of system resource",
    ]


def test_the_summary_comes_with_the_next_line_of_any_kind() -> None:
    clock = Clock()
    logger, lines = limited(clock)
    for _ in range(5):
        logger.warning("nri: cannot connect to %s", "/run/nri.sock")
    clock.now += 30
    logger.info("hcsd stopped")
    assert lines[-2:] == [
        "suppressed 2 repeat(s) in 30s of: nri: cannot connect to /run/nri.sock",
        "hcsd stopped",
    ]


def test_different_messages_are_not_held_back() -> None:
    clock = Clock()
    logger, lines = limited(clock)
    for i in range(100):
        logger.warning("%s: runs on unhealthy device gpu-0", f"ns/pod-{i}/main")
    assert len(lines) == 100
