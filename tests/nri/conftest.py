"""The `nri` fixture: hcsd's plugin in a session with a runtime peer (tests/nri/test_plugin.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hcsd.discovery import Inventory
from tests.nri.test_plugin import Setup, plugin_setup


@pytest.fixture
async def nri(tmp_path: Path, mixed_inventory: Inventory) -> AsyncIterator[Setup]:
    async with plugin_setup(tmp_path, mixed_inventory) as setup:
        yield setup
