"""What is generated from the config sections: docs/configuration.md (checked in, kept current),
the man page's CONFIGURATION section, and `hcsd --check-config`'s report."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hcsd.daemon.config import Config
from hcsd.daemon.lifecycle import main
from hcsd.daemon.reference import render_markdown, render_roff
from hcsd.sections import tables

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_configuration_doc_is_current() -> None:
    """Fails when a section changes and `make config-docs` was not run."""
    assert (ROOT / "docs" / "configuration.md").read_text() == render_markdown()


def test_markdown_has_a_row_per_key() -> None:
    text = render_markdown()
    for table in tables(Config):
        assert f"## `[{table.name}]`" in text
        for s in table.settings:
            assert f"| `{s.name}` | " in text
    assert '| `policy` | `"binpack"` | one of binpack, spread | on reload |' in text


def test_reference_check_command_detects_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text(render_markdown().replace("`compact_after`", "`compact`"))
    run = [sys.executable, "-m", "hcsd.daemon.reference", "check", str(stale)]
    result = subprocess.run(run, capture_output=True, text=True, check=False)
    assert result.returncode == 1 and "is stale: run make config-docs" in result.stderr
    stale.write_text(render_markdown())
    assert subprocess.run(run, capture_output=True, check=False).returncode == 0


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff is not installed")
def test_man_page_renders_every_key_without_warnings(tmp_path: Path) -> None:
    """The real build step (packaging/manpages.py), then groff with all warnings on."""
    for section in ("man1", "man8"):
        (tmp_path / section).mkdir()
    subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "manpages.py"), "0.0", str(tmp_path)],
        check=True,
        cwd=ROOT,
    )
    page = (tmp_path / "man8" / "hcsd.8").read_text()
    assert render_roff() in page + "\n"
    result = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", str(tmp_path / "man8" / "hcsd.8")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stderr == ""
    text = re.sub(".\x08", "", result.stdout)  # no overstriking (bold, underline)
    assert "CONFIGURATION" in text
    for table in tables(Config):
        assert f"[{table.name}]" in text
        for s in table.settings:
            assert s.name in text


def test_check_config_reports_every_problem_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "hcsd.toml"
    path.write_text("[metrics]\nlisten = 'x'\n[ledger]\ncompact_after = -3\nsize = 1\n")
    assert main(["--config", str(path), "--check-config"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"hcsd: {path}: metrics.listen: expected HOST:PORT (or an empty string to disable), "
        "got 'x'",
        f"hcsd: {path}: ledger.size: unknown key (known: compact_after)",
        f"hcsd: {path}: ledger.compact_after: expected a positive integer, got -3",
    ]


def test_check_config_accepts_a_good_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "hcsd.toml"
    path.write_text("[runtime.driver_paths]\nnvidia = ['/opt/nvidia']\n")
    assert main(["--config", str(path), "--check-config"]) == 0
    assert capsys.readouterr().out == f"hcsd: configuration {path} is valid\n"
