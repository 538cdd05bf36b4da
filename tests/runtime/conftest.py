"""Fixtures for tests against a real containerd: the built peers, a scratch containerd."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime.containerd import Containerd
from tests.runtime.peers import Binaries, ensure_binaries


@pytest.fixture(scope="session")
def runtime_binaries() -> Binaries:
    if os.geteuid() != 0:
        pytest.skip("containerd tests need root")
    if not Path("/bin/busybox").exists():
        pytest.skip("busybox is not installed (apt install busybox-static)")
    found = ensure_binaries()
    if isinstance(found, str):
        pytest.skip(f"containerd cannot be had here: {found}")
    return found


@pytest.fixture
def containerd(runtime_binaries: Binaries, tmp_path: Path) -> Iterator[Containerd]:
    # A short path: unix socket paths are limited to 108 bytes.
    directory = Path("/tmp") / f"hcs-ctrd-{os.getpid()}-{tmp_path.name[-8:]}"
    directory.mkdir(parents=True, exist_ok=True)
    runtime = Containerd(runtime_binaries, directory)
    try:
        runtime.start()
    except RuntimeError:
        runtime.close()
        raise
    yield runtime
    runtime.close()
