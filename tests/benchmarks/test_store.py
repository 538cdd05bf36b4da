"""The measured-figures file: read back as written, written atomically, corruption named."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from hcsd.benchmarks import Measurement
from hcsd.benchmarks.store import MeasuredStore
from hcsd.fs import FileSystem
from hcsd.profiles.fingerprint import MeasurementError, load_measured

UUID = "GPU-00000000-0000-0000-0000-000000000000"


def measurement(tflops: float = 301.25, uuid: str = UUID) -> Measurement:
    return Measurement(uuid, tflops, 312.0, 1650.5, 1.0, 48, 8192, "libcublas.so.12", 1.7e9)


def test_what_is_written_is_read_back(tmp_path: Path) -> None:
    path = tmp_path / "state" / "measured.json"
    store = MeasuredStore(str(path))
    assert store.load() == {}
    store.put(measurement())
    store.put(measurement(200.0, "other"))
    store.put(measurement(290.0))  # a newer figure replaces the older one
    assert MeasuredStore(str(path)).load() == {
        UUID: measurement(290.0),
        "other": measurement(200.0, "other"),
    }
    # the format every reader of measured figures knows (profiles.fingerprint)
    assert load_measured(path) == {UUID: {"tflops_fp16": 290.0}, "other": {"tflops_fp16": 200.0}}
    assert json.loads(path.read_text())[UUID]["ratio"] == pytest.approx(290 / 312, abs=1e-4)
    assert path.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        pytest.param(
            lambda text: text.replace('"tflops_fp16": 301.25', '"tflops_fp16": 999.0'),
            "checksum mismatch",
            id="figure-changed",
        ),
        pytest.param(lambda text: text[: len(text) // 2], "failed to parse", id="torn"),
        pytest.param(
            lambda text: text.replace('"tflops_fp16": 301.25', '"tflops_fp16": -1'),
            "expected a positive number",
            id="negative",
        ),
    ],
)
def test_a_damaged_file_is_named_and_moved_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object, why: str
) -> None:
    path = tmp_path / "measured.json"
    MeasuredStore(str(path)).put(measurement())
    path.write_text(damage(path.read_text()))  # type: ignore[operator]
    damaged = path.read_text()
    with caplog.at_level(logging.ERROR):
        assert MeasuredStore(str(path)).load() == {}
    assert not path.exists() and (tmp_path / "measured.json.corrupt").read_text() == damaged
    (line,) = caplog.messages
    assert line.startswith("measure: ") and why in line
    assert line.endswith(f"; moved to {path}.corrupt, devices keep their profile figures")


def test_an_entry_written_by_hand_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "measured.json"
    path.write_text(json.dumps({UUID: {"tflops_fp16": 280}}))
    (found,) = MeasuredStore(str(path)).load().values()
    assert (found.tflops_fp16, found.ratio, found.bandwidth_gbps) == (280.0, None, None)


class CrashAtRename(FileSystem):
    def replace(self, source: str, target: str, dir_fd: int) -> None:
        raise OSError("simulated crash before the rename")


def test_a_crash_while_writing_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "measured.json"
    MeasuredStore(str(path)).put(measurement())
    before = path.read_text()
    store = MeasuredStore(str(path), CrashAtRename())
    store.load()
    with pytest.raises(OSError, match="simulated crash"):
        store.put(measurement(100.0))
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["measured.json"]


@pytest.mark.parametrize(
    ("content", "why"),
    [
        pytest.param(b'{"GPU-x": {"tflops_fp16": 1\xff}}', "not UTF-8", id="non-utf8"),
        pytest.param(b'{"GPU-x": {"tflops_fp16": NaN}}', "NaN", id="nan"),
        pytest.param(b'{"GPU-x": {"tflops_fp16": Infinity}}', "Infinity", id="infinity"),
        pytest.param(b'{"GPU-x": {"tflops_fp16": 1e999}}', "not inf", id="overflow"),
        pytest.param(
            b'{"GPU-x": {"tflops_fp16": 300, "library": "libcublas.so.12", "at": 1}}',
            "no checksum",
            id="hcsd-fields-without-checksum",
        ),
    ],
)
def test_bad_bytes_and_numbers_are_named_errors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes, why: str
) -> None:
    path = tmp_path / "measured.json"
    path.write_bytes(content)
    if "checksum" not in why:  # the format's own checks (a hand-written file has no checksum)
        with pytest.raises(MeasurementError, match=why):
            load_measured(path)
    with caplog.at_level(logging.ERROR):
        assert MeasuredStore(str(path)).load() == {}
    assert (tmp_path / "measured.json.corrupt").read_bytes() == content
    (line,) = caplog.messages
    assert why in line


def test_corrupt_copies_are_numbered_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "measured.json"
    for content in (b"{", b"[", b"nul"):
        path.write_bytes(content)
        assert MeasuredStore(str(path)).load() == {}
    assert (tmp_path / "measured.json.corrupt").read_bytes() == b"{"
    assert (tmp_path / "measured.json.corrupt.1").read_bytes() == b"["
    assert (tmp_path / "measured.json.corrupt.2").read_bytes() == b"nul"


def test_a_directory_in_place_of_the_file_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "measured.json"
    path.mkdir()
    store = MeasuredStore(str(path))
    with caplog.at_level(logging.ERROR):
        assert store.load() == {}
    assert path.is_dir()  # left where it is: not a file hcsd wrote
    (line,) = caplog.messages
    assert "failed to read" in line and str(path) in line


class CountingReads(FileSystem):
    def __init__(self) -> None:
        self.reads: list[str] = []

    def read(self, path: str) -> bytes | None:
        self.reads.append(path)
        return super().read(path)


def test_the_file_is_read_once_through_the_file_system(tmp_path: Path) -> None:
    path = tmp_path / "measured.json"
    MeasuredStore(str(path)).put(measurement())
    fs = CountingReads()
    assert MeasuredStore(str(path), fs).load() == {UUID: measurement()}
    assert fs.reads == [str(path)]
