"""Fixtures for tests against a real containerd: the built peers, the images, a scratch containerd.

Everything here skips with the reason when a peer cannot be had (not root, no Go, a failed
build), and the cold build prints its progress past pytest's capture: it takes minutes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.peers.building import Log
from tests.harness.peers.runtimes import (
    Binaries,
    ensure_binaries,
    ensure_containerd_17,
    ensure_containerd_21,
)
from tests.runtime.containerd import Containerd
from tests.runtime.image import ImageError, ensure_busybox_image, ensure_pause_image


def _terminal_log(config: pytest.Config) -> Log:
    """A logger that writes to the terminal even while pytest captures output."""
    capture = config.pluginmanager.getplugin("capturemanager")

    def log(message: str) -> None:
        if capture is None:
            print(message, file=sys.stderr, flush=True)
            return
        with capture.global_and_fixture_disabled():
            print(message, file=sys.stderr, flush=True)

    return log


@pytest.fixture(scope="session")
def runtime_binaries(pytestconfig: pytest.Config) -> Binaries:
    """containerd 2.3, its shim, ctr, crictl and runc; skips loudly with the reason."""
    if os.geteuid() != 0:
        pytest.skip("the real-runtime tests need root (containerd, runc, mounts, cgroups)")
    found = ensure_binaries(_terminal_log(pytestconfig))
    if isinstance(found, str):
        pytest.skip(f"the runtime peers cannot be had here: {found}")
    return found


@pytest.fixture(scope="session")
def runtime_binaries_17(pytestconfig: pytest.Config, runtime_binaries: Binaries) -> Binaries:
    """The same peers with containerd 1.7 (NRI v0.8) in place of 2.3; optional."""
    found = ensure_containerd_17(runtime_binaries, _terminal_log(pytestconfig))
    if isinstance(found, str):
        pytest.skip(f"containerd 1.7 cannot be had here: {found}")
    return found


@pytest.fixture(scope="session")
def runtime_binaries_21(pytestconfig: pytest.Config, runtime_binaries: Binaries) -> Binaries:
    """The same peers with containerd 2.1 (NRI v0.8, NRI on by default); optional."""
    found = ensure_containerd_21(runtime_binaries, _terminal_log(pytestconfig))
    if isinstance(found, str):
        pytest.skip(f"containerd 2.1 cannot be had here: {found}")
    return found


@pytest.fixture(scope="session")
def busybox_image() -> Path:
    """The OCI layout tarball of docker.io/hcs/busybox:test (the pause image is built too)."""
    try:
        ensure_pause_image()
        return ensure_busybox_image()
    except ImageError as e:
        pytest.skip(f"the test images cannot be built: {e}")


def _launched(binaries: Binaries, tmp_path: Path) -> Iterator[Containerd]:
    nri_socket = tmp_path / "nri" / "nri.sock"
    with Containerd(binaries, tmp_path / "containerd", nri_socket=nri_socket) as runtime:
        yield runtime


@pytest.fixture
def containerd(
    runtime_binaries: Binaries, busybox_image: Path, tmp_path: Path
) -> Iterator[Containerd]:
    """A running containerd 2.3 of its own; NRI listens on `tmp_path/nri/nri.sock`."""
    yield from _launched(runtime_binaries, tmp_path)


@pytest.fixture
def containerd_17(
    runtime_binaries_17: Binaries, busybox_image: Path, tmp_path: Path
) -> Iterator[Containerd]:
    """A running containerd 1.7 with NRI enabled; NRI listens on `tmp_path/nri/nri.sock`."""
    yield from _launched(runtime_binaries_17, tmp_path)


@pytest.fixture
def containerd_21(
    runtime_binaries_21: Binaries, busybox_image: Path, tmp_path: Path
) -> Iterator[Containerd]:
    """A running containerd 2.1; NRI listens on `tmp_path/nri/nri.sock`."""
    yield from _launched(runtime_binaries_21, tmp_path)
