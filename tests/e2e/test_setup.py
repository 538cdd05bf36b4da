"""hcsctl setup containerd|crio on temp trees with real containerd 1.7 and 2.x config shapes."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from hcsd.cli.hcsctl import main
from tests.harness.peers.runtimes import (
    CONTAINERD_17_VERSION,
    CONTAINERD_VERSION,
    ensure_binaries,
    ensure_containerd_17,
)

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
    assert "no NRI validator and ignores default_validator" in out
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
    assert drop_in["plugins"]["io.containerd.nri.v1.nri"]["default_validator"] == {
        "enable": True,
        "required_plugins": ["hcsd"],
    }
    backups = list((root / "etc/containerd").glob("config.toml.hcs-backup-*"))
    assert len(backups) == 1 and backups[0].read_text() == CONTAINERD_17
    wrapper = root / "opt/nri/plugins/10-hcsd"
    assert wrapper.stat().st_mode & 0o777 == 0o755
    assert "exec /usr/bin/hcs-nri-plugin" in wrapper.read_text()
    # Idempotent: a second run changes nothing.
    assert main(["setup", "containerd", "--root", str(root), "--yes", "--prelaunched"]) == 0
    assert len(list((root / "etc/containerd").glob("config.toml.hcs-backup-*"))) == 1


def validator(drop_in: Path) -> dict[str, object]:
    section: dict[str, object] = tomllib.loads(drop_in.read_text())["plugins"][
        "io.containerd.nri.v1.nri"
    ]["default_validator"]
    return section


def test_containerd_2_requires_hcsd_through_the_default_validator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """NRI is on by default in 2.x: the drop-in carries only the validator, so the user's
    socket and timeouts stay."""
    root = tree(tmp_path, CONTAINERD_2)
    assert main(["setup", "containerd", "--root", str(root), "--yes"]) == 0
    assert "already enabled" in capsys.readouterr().out
    drop_in = root / "etc/containerd/conf.d/10-hcsd-nri.toml"
    assert validator(drop_in) == {"enable": True, "required_plugins": ["hcsd"]}
    assert set(tomllib.loads(drop_in.read_text())["plugins"]["io.containerd.nri.v1.nri"]) == {
        "default_validator"
    }
    config = tomllib.loads((root / "etc/containerd/config.toml").read_text())
    assert config["imports"] == ["/etc/containerd/conf.d/*.toml"]
    assert not (root / "opt/nri").exists()
    assert main(["setup", "containerd", "--root", str(root), "--yes"]) == 0
    assert "nothing to change" in capsys.readouterr().out


def test_the_validator_keeps_the_users_required_plugins(tmp_path: Path) -> None:
    """containerd replaces a plugin section's list from an import (it does not append)."""
    user = CONTAINERD_2 + (
        "    [plugins.'io.containerd.nri.v1.nri'.default_validator]\n"
        '      required_plugins = ["policy"]\n'
    )
    root = tree(tmp_path, user)
    assert main(["setup", "containerd", "--root", str(root), "--yes"]) == 0
    drop_in = root / "etc/containerd/conf.d/10-hcsd-nri.toml"
    assert validator(drop_in)["required_plugins"] == ["policy", "hcsd"]


def test_a_config_that_already_requires_hcsd_is_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    user = CONTAINERD_2 + (
        "    [plugins.'io.containerd.nri.v1.nri'.default_validator]\n"
        '      enable = true\n      required_plugins = ["hcsd"]\n'
    )
    root = tree(tmp_path, user)
    assert main(["setup", "containerd", "--root", str(root), "--yes"]) == 0
    assert "already requires the hcsd NRI plugin" in capsys.readouterr().out
    assert (root / "etc/containerd/config.toml").read_text() == user


def containerd(version: str) -> Path:
    """The real containerd at `version`, built (and cached) now if it is not yet: on a cold
    machine this suite runs before the runtime suites that would otherwise build it."""
    binaries = ensure_binaries()
    if not isinstance(binaries, str) and version == CONTAINERD_17_VERSION:
        binaries = ensure_containerd_17(binaries)
    if isinstance(binaries, str):
        pytest.skip(f"containerd {version} cannot be had: {binaries}")
    assert binaries.containerd_version == version
    return binaries.containerd


def dump(binary: Path, root: Path) -> str:
    """`containerd config dump` of the tree's config, its imports pointed into the tree."""
    config = root / "etc/containerd/config.toml"
    config.write_text(config.read_text().replace('"/etc/', f'"{root}/etc/'))
    result = subprocess.run(
        [str(binary), "--config", str(config), "config", "dump"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout


def test_containerd_2_reads_the_required_plugin_from_the_drop_in(tmp_path: Path) -> None:
    """The real containerd merges the drop-in as written: validator on, hcsd and the user's
    plugin required, the user's NRI socket kept."""
    binary = containerd(CONTAINERD_VERSION)
    user = CONTAINERD_2.replace("nri.sock", "custom.sock") + (
        "    [plugins.'io.containerd.nri.v1.nri'.default_validator]\n"
        '      required_plugins = ["policy"]\n'
    )
    root = tree(tmp_path, user)
    assert main(["setup", "containerd", "--root", str(root), "--yes"]) == 0
    nri = tomllib.loads(dump(binary, root))["plugins"]["io.containerd.nri.v1.nri"]
    assert nri["socket_path"] == "/var/run/nri/custom.sock" and nri["disable"] is False
    assert nri["default_validator"]["enable"] is True
    assert nri["default_validator"]["required_plugins"] == ["policy", "hcsd"]


def test_containerd_17_ignores_the_validator(tmp_path: Path) -> None:
    """1.7's NRI (v0.8) has no validator: the keys load without error and do nothing, and
    setup says so."""
    binary = containerd(CONTAINERD_17_VERSION)
    root = tree(tmp_path, CONTAINERD_17)
    assert main(["setup", "containerd", "--root", str(root), "--yes"]) == 0
    nri = tomllib.loads(dump(binary, root))["plugins"]["io.containerd.nri.v1.nri"]
    assert nri["disable"] is False and "default_validator" not in nri


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


POSTRM = Path(__file__).resolve().parents[2] / "packaging/deb/postrm"
# Run the package's postrm with /etc and /opt as overlays (writes land in the test's
# directory), in a mount namespace of its own: the host's files are not touched.
OVERLAID_POSTRM = """
set -e
for d in etc opt; do
  mkdir -p "$1/$d-upper" "$1/$d-work"
  mount -t overlay overlay -o "lowerdir=/$d,upperdir=$1/$d-upper,workdir=$1/$d-work" "/$d"
done
mkdir -p /etc/containerd/conf.d
cp "$1/drop-in.toml" /etc/containerd/conf.d/10-hcsd-nri.toml
sh "$2" remove
if [ -e /etc/containerd/conf.d/10-hcsd-nri.toml ]; then echo KEPT; else echo GONE; fi
"""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
@pytest.mark.parametrize(
    ("written_by_setup", "outcome"), [(True, "GONE"), (False, "KEPT")], ids=["ours", "theirs"]
)
def test_removing_the_package_drops_the_hcsd_requirement(
    tmp_path: Path, written_by_setup: bool, outcome: str
) -> None:
    """Left behind, the drop-in would make containerd refuse every container once hcsd is
    gone; a file of the same name that setup did not write is not ours to delete."""
    if os.geteuid() != 0:
        pytest.skip("mount namespaces and overlays need root")
    root = tree(tmp_path / "setup", CONTAINERD_2)
    assert main(["setup", "containerd", "--root", str(root), "--yes"]) == 0
    text = (root / "etc/containerd/conf.d/10-hcsd-nri.toml").read_text()
    if not written_by_setup:
        text = "# the operator's own file\n" + text
    (tmp_path / "drop-in.toml").write_text(text)
    result = subprocess.run(
        [
            *("unshare", "-m", "--propagation", "private"),
            *("sh", "-c", OVERLAID_POSTRM, "sh", str(tmp_path), str(POSTRM)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == outcome, result.stdout
    assert ("restart containerd" in result.stdout) is written_by_setup
