"""Fixtures for discovery: the fake libraries built once, and fake nodes described in data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fakes import build_fakes


@pytest.fixture(scope="session")
def fake_libs() -> Path:
    build = build_fakes()
    if build is None:
        pytest.skip("NO C COMPILER: the fake vendor libraries cannot be built; backend tests skip")
    return build


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
