"""hcsctl setup containerd|crio on temp trees with real containerd 1.7 and 2.x config shapes."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from hcsd.cli.main import main

# The shape `containerd config default` prints: 1.7 (version 2, NRI disabled) and 2.x (version 3).
CONTAINERD_17 = """\
disabled_plugins = []
imports = []
oom_score = 0
version = 2

[plugins]

  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.8"

  [plugins."io.containerd.nri.v1.nri"]
    disable = true
    disable_connections = false
    plugin_config_path = "/etc/nri/conf.d"
    plugin_path = "/opt/nri/plugins"
    socket_path = "/var/run/nri/nri.sock"
"""

CONTAINERD_2 = """\
version = 3
root = '/var/lib/containerd'

[plugins]
  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = '/var/run/nri/nri.sock'
"""


def tree(tmp_path: Path, config: str | None) -> Path:
    if config is not None:
        path = tmp_path / "etc/containerd/config.toml"
        path.parent.mkdir(parents=True)
        path.write_text(config)
    return tmp_path


def test_containerd_17_dry_run_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree(tmp_path, CONTAINERD_17)
    assert main(["setup", "containerd", "--root", str(root), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "+  disable = false" in out
    assert '+imports = ["/etc/containerd/conf.d/*.toml"]' in out
    assert not (root / "etc/containerd/conf.d").exists()
    assert (root / "etc/containerd/config.toml").read_text() == CONTAINERD_17


def test_containerd_17_refuses_without_yes(tmp_path: Path) -> None:
    root = tree(tmp_path, CONTAINERD_17)
    assert main(["setup", "containerd", "--root", str(root)]) == 2
    assert (root / "etc/containerd/config.toml").read_text() == CONTAINERD_17


def test_containerd_17_apply(tmp_path: Path) -> None:
    root = tree(tmp_path, CONTAINERD_17)
    assert main(["setup", "containerd", "--root", str(root), "--yes", "--prelaunched"]) == 0
    config = tomllib.loads((root / "etc/containerd/config.toml").read_text())
    assert config["imports"] == ["/etc/containerd/conf.d/*.toml"]
    # Only the imports line changed; the user's disable = true stays, the drop-in overrides it.
    assert config["plugins"]["io.containerd.nri.v1.nri"]["disable"] is True
    drop_in = tomllib.loads((root / "etc/containerd/conf.d/10-hcsd-nri.toml").read_text())
    assert drop_in["version"] == 2
    assert drop_in["plugins"]["io.containerd.nri.v1.nri"]["disable"] is False
    backups = list((root / "etc/containerd").glob("config.toml.hcs-backup-*"))
    assert len(backups) == 1 and backups[0].read_text() == CONTAINERD_17
    wrapper = root / "opt/nri/plugins/10-hcsd"
    assert wrapper.stat().st_mode & 0o777 == 0o755
    assert "exec /usr/bin/hcs-nri-plugin" in wrapper.read_text()
    # Idempotent: a second run changes nothing.
    assert main(["setup", "containerd", "--root", str(root), "--yes", "--prelaunched"]) == 0
    assert len(list((root / "etc/containerd").glob("config.toml.hcs-backup-*"))) == 1


def test_containerd_2_has_nri_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tree(tmp_path, CONTAINERD_2)
    assert main(["setup", "containerd", "--root", str(root), "--yes"]) == 0
    assert "already enabled" in capsys.readouterr().out
    assert (root / "etc/containerd/config.toml").read_text() == CONTAINERD_2
    assert not (root / "opt/nri").exists()


def test_containerd_bad_config(tmp_path: Path) -> None:
    root = tree(tmp_path, "version = [")
    assert main(["setup", "containerd", "--root", str(root), "--dry-run"]) == 1


def test_crio(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["setup", "crio", "--root", str(tmp_path), "--yes"]) == 0
    text = (tmp_path / "etc/crio/crio.conf.d/10-hcsd-nri.conf").read_text()
    assert tomllib.loads(text)["crio"]["nri"]["enable_nri"] is True
    assert "nothing to change" not in capsys.readouterr().out
    assert main(["setup", "crio", "--root", str(tmp_path), "--yes"]) == 0
    assert "nothing to change" in capsys.readouterr().out
