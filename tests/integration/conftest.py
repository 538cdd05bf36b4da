"""Fixtures the daemon tests share with the watchdog's: the fake GPU node, real cgroups,
libhcs (tests/watchdog/conftest.py)."""

from tests.watchdog.conftest import containers, gpu_node, libhcs  # noqa: F401
