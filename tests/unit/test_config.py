from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from hcsd.daemon.config import KEYS, ConfigError, load_config, render_default_config
from hcsd.model import SpreadPolicy


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "hcsd.toml"
    path.write_text(text)
    return str(path)


def test_missing_default_file_means_defaults() -> None:
    config = load_config("/nonexistent/hcsd.toml")
    assert config.socket == "/run/hcsd/hcsd.sock"
    assert config.metrics_listen == "127.0.0.1:9400"
    assert config.policy is SpreadPolicy.BINPACK
    assert config.node_name  # the host name


def test_explicit_missing_file_is_an_error() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/hcsd.toml", required=True)


def test_values_are_read(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, '[allocator]\npolicy = "spread"\n[metrics]\nlisten = ""\n')
    )
    assert config.policy is SpreadPolicy.SPREAD
    assert config.metrics_listen == ""


def test_watchdog_section(tmp_path: Path) -> None:
    defaults = load_config(None)
    assert defaults.watchdog_enabled and defaults.watchdog_policy == "warn"
    assert defaults.watchdog_interval == 5.0 and defaults.watchdog_process_overhead == 2**30
    config = load_config(
        write(
            tmp_path,
            '[watchdog]\npolicy = "kill"\ninterval = 2\ntolerance_percent = 0\n'
            'process_overhead = "1Gi"\n',
        )
    )
    assert (config.watchdog_policy, config.watchdog_interval) == ("kill", 2.0)
    assert config.watchdog_tolerance_percent == 0.0
    assert config.watchdog_process_overhead == 2**30


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("[alocator]\n", r"unknown section \[alocator\]", id="typo-section"),
        pytest.param(
            "[allocator]\npolicie = 'x'\n", "unknown key allocator.policie", id="typo-key"
        ),
        pytest.param(
            "[allocator]\npolicy = 'pack'\n", "allocator.policy: expected one of", id="bad-choice"
        ),
        pytest.param("[daemon]\nsocket = 'relative.sock'\n", "absolute path", id="relative"),
        pytest.param("[metrics]\nlisten = '9400'\n", "HOST:PORT", id="bad-listen"),
        pytest.param("[ledger]\ncompact_after = 0\n", "positive integer", id="zero"),
        pytest.param("[ledger]\ncompact_after = true\n", "positive integer", id="bool"),
        pytest.param("[daemon]\nshutdown_grace = -1\n", "positive number", id="negative"),
        pytest.param("[discovery]\nbackends = 'simulated'\n", "list of non-empty", id="list"),
        pytest.param("daemon = 3\n", "must be a table", id="not-a-table"),
        pytest.param("[watchdog]\npolicy = 'shoot'\n", "expected one of warn, kill", id="policy"),
        pytest.param(
            "[watchdog]\ntolerance_percent = 101\n", r"percentage in \[0, 100\]", id="percent"
        ),
        pytest.param(
            "[watchdog]\nprocess_overhead = 'lots'\n", 'quantity such as "512Mi"', id="overhead"
        ),
        pytest.param("[daemon\n", "failed to parse", id="bad-toml"),
    ],
)
def test_bad_config_is_refused_with_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text))


def test_default_config_documents_every_key_and_parses() -> None:
    text = render_default_config()
    for key in KEYS:
        assert f"#{key.name} = " in text
    uncommented = re.sub(r"^#(\w+ = )", r"\1", text, flags=re.MULTILINE)
    values = tomllib.loads(uncommented)
    assert values["daemon"]["socket"] == "/run/hcsd/hcsd.sock"
    assert load_config(None).values == _loaded(uncommented)


def _loaded(text: str) -> object:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write(text)
        f.flush()
        return load_config(f.name).values


def test_restart_needed_lists_non_reloadable_changes(tmp_path: Path) -> None:
    old = load_config(write(tmp_path, "[allocator]\npolicy = 'binpack'\n"))
    new = load_config(
        write(tmp_path, "[allocator]\npolicy = 'spread'\n[daemon]\nsocket = '/tmp/x.sock'\n")
    )
    assert old.restart_needed(new) == ["daemon.socket"]
