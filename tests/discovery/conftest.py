"""Fixtures for discovery: device nodes where the test may make them (the fake libraries are
tests/conftest.py's `fake_libs`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def can_mknod(tmp_path_factory: pytest.TempPathFactory) -> bool:
    probe = tmp_path_factory.mktemp("mknod") / "probe"
    try:
        os.mknod(probe, 0o600 | 0o020000, os.makedev(1, 3))
    except PermissionError:
        return False
    return True


@pytest.fixture
def devfs(tmp_path: Path, can_mknod: bool) -> Path:
    if not can_mknod:
        pytest.skip("NOT ROOT: device nodes cannot be created (os.mknod needs CAP_MKNOD)")
    root = tmp_path / "dev"
    root.mkdir()
    return root
