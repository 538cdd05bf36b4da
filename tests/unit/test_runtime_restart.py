"""hcsctl setup's restart: --no-restart needs neither hcsd.systemd nor dbus-fast."""

from __future__ import annotations

import sys

import pytest

from hcsd.cli.runtime_restart import restart_runtime


def test_no_restart_does_not_import_the_systemd_client(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "hcsd.systemd", None)  # importing it raises ImportError
    assert restart_runtime("containerd", "containerd.service", 1.0, restart=False) == 0
    assert capsys.readouterr().out == "now restart containerd: systemctl restart containerd\n"
