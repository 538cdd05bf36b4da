"""The config file: every check, every problem reported with its file and key, reload rules."""

from __future__ import annotations

import dataclasses
import re
import socket
import tomllib
from pathlib import Path

import pytest

from hcsd.daemon.config import Config, ConfigError, load_config
from hcsd.daemon.reference import render_default_config
from hcsd.model import SpreadPolicy
from hcsd.runtime.driver_settings import LibraryPaths
from hcsd.runtime.settings import DriverPaths, RuntimeSection
from hcsd.sections import merge_reloadable, tables, values

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "hcsd.toml"
    path.write_text(text)
    return str(path)


def test_missing_default_file_means_defaults() -> None:
    config = load_config("/nonexistent/hcsd.toml")
    assert config == Config()
    assert config.daemon.socket == "/run/hcsd/api/hcsd.sock"
    assert config.metrics.listen == "127.0.0.1:9400"
    assert config.allocator.policy is SpreadPolicy.BINPACK
    assert config.runtime.driver_paths.nvidia == ("/usr/local/nvidia",)
    assert config.node.resolved_name() == socket.gethostname()
    assert config.source == "<defaults>"


def test_explicit_missing_file_is_an_error() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/hcsd.toml", required=True)


def test_values_are_read_typed(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            '[node]\nname = "n1"\n[allocator]\npolicy = "spread"\n[metrics]\nlisten = ""\n'
            '[discovery]\nbackends = ["auto", "simulated"]\n[health]\nquiet_period = 60\n'
            '[runtime]\ncdi_dir = ""\n[runtime.driver_paths]\nnvidia = ["/opt/nv", "/opt/x"]\n',
        )
    )
    assert config.node.resolved_name() == "n1"
    assert config.allocator.policy is SpreadPolicy.SPREAD
    assert config.metrics.listen == ""
    assert config.discovery.backends == ("auto", "simulated")
    assert config.health.quiet_period == 60.0 and isinstance(config.health.quiet_period, float)
    assert config.runtime.cdi_dir == ""
    assert config.runtime.driver_paths.nvidia == ("/opt/nv", "/opt/x")
    # the vendors not named keep their defaults
    assert config.runtime.driver_paths.ascend == DriverPaths().ascend
    assert config.source == str(tmp_path / "hcsd.toml")


def test_driver_paths_as_an_inline_table(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[runtime]\ndriver_paths = { hygon = ["/opt/dcu"] }\n'))
    assert config.runtime.driver_paths.hygon == ("/opt/dcu",)


RULE = "{vendor = 'nvidia', code = 'x', severity = 'fatal', pattern = '(?P<bus>[0-9:.]+) bad'}"


def test_watchdog_section(tmp_path: Path) -> None:
    from hcsd.watchdog import Policy

    defaults = load_config(None).watchdog
    assert defaults.enabled and defaults.policy is Policy.WARN
    assert defaults.interval == 5.0 and defaults.process_overhead == 2**30
    config = load_config(
        write(
            tmp_path,
            '[watchdog]\npolicy = "kill"\ninterval = 2\ntolerance_percent = 0\n'
            'process_overhead = "512Mi"\n',
        )
    ).watchdog
    settings = config.watchdog_settings()
    assert (settings.policy, settings.interval) == (Policy.KILL, 2.0)
    assert settings.tolerance.percent == 0.0 and settings.tolerance.per_process_bytes == 2**29


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "[alocator]\n", r"alocator: unknown section \(known: allocator, ", id="section"
        ),
        pytest.param(
            "[allocator]\npolicie = 'x'\n",
            r"allocator.policie: unknown key \(known: policy\)",
            id="key",
        ),
        pytest.param(
            "[runtime.driver_paths]\nnvida = []\n",
            r"runtime.driver_paths.nvida: unknown key \(known: ascend, ascend_files, cambricon, "
            r"cambricon_files, hygon, library_path, nvidia, nvidia_files\)",
            id="nested-key",
        ),
        pytest.param("daemon = 3\n", "daemon: must be a table", id="not-a-table"),
        pytest.param(
            "[runtime]\ndriver_paths = 3\n",
            "runtime.driver_paths: must be a table",
            id="nested-not-a-table",
        ),
        pytest.param(
            "[watchdog]\npolicy = 'shoot'\n",
            "watchdog.policy: expected one of warn, kill, got 'shoot'",
            id="watchdog-policy",
        ),
        pytest.param(
            "[watchdog]\ntolerance_percent = 101\n",
            r"watchdog.tolerance_percent: expected a percentage in \[0, 100\]",
            id="percent",
        ),
        pytest.param(
            "[watchdog]\ntolerance_percent = -1\n",
            r"watchdog.tolerance_percent: expected a percentage in \[0, 100\]",
            id="percent-negative",
        ),
        pytest.param(
            "[watchdog]\nprocess_overhead = 'lots'\n",
            'watchdog.process_overhead: expected a quantity such as "512Mi"',
            id="overhead",
        ),
        pytest.param(
            "[watchdog]\nprocess_overhead = true\n",
            'watchdog.process_overhead: expected a quantity such as "512Mi", got True',
            id="overhead-type",
        ),
        pytest.param("[daemon\n", "failed to parse", id="bad-toml"),
        pytest.param("[node]\nname = 3\n", "node.name: expected a string, got 3", id="string"),
        pytest.param(
            "[allocator]\npolicy = 'pack'\n",
            "allocator.policy: expected one of binpack, spread, got 'pack'",
            id="enum",
        ),
        pytest.param(
            "[daemon]\nlog_level = 'loud'\n",
            "daemon.log_level: expected one of debug, info, warning, error",
            id="choice",
        ),
        pytest.param(
            "[daemon]\nsocket = 'relative.sock'\n",
            "daemon.socket: expected an absolute path, got 'relative.sock'",
            id="relative",
        ),
        pytest.param(
            "[daemon]\nstate_dir = ''\n",
            "daemon.state_dir: expected an absolute path, got ''",
            id="empty-path",
        ),
        pytest.param(
            "[discovery]\nnvml_library = 'lib.so'\n",
            "discovery.nvml_library: expected an absolute path or an empty string",
            id="path-or-empty",
        ),
        pytest.param(
            "[metrics]\nlisten = '9400'\n",
            "metrics.listen: expected HOST:PORT",
            id="listen-no-host",
        ),
        pytest.param(
            "[metrics]\nlisten = 'localhost:70000'\n",
            "metrics.listen: expected HOST:PORT",
            id="listen-port",
        ),
        pytest.param(
            "[ledger]\ncompact_after = 0\n",
            "ledger.compact_after: expected a positive integer",
            id="zero",
        ),
        pytest.param(
            "[ledger]\ncompact_after = true\n",
            "ledger.compact_after: expected a positive integer",
            id="bool-int",
        ),
        pytest.param(
            "[ledger]\ncompact_after = 1.5\n",
            "ledger.compact_after: expected a positive integer",
            id="float-int",
        ),
        pytest.param(
            "[daemon]\nshutdown_grace = -1\n",
            "daemon.shutdown_grace: expected a positive number of seconds",
            id="negative",
        ),
        pytest.param(
            "[health]\ntick_interval = '1s'\n",
            "health.tick_interval: expected a positive number of seconds",
            id="seconds-text",
        ),
        pytest.param(
            "[health]\ndegraded_below = 0\n",
            r"health.degraded_below: expected a score in \(0, 100\]",
            id="score-zero",
        ),
        pytest.param(
            "[health]\nunhealthy_below = 101\n",
            r"health.unhealthy_below: expected a score in \(0, 100\]",
            id="score-high",
        ),
        pytest.param(
            "[discovery]\nbackends = 'simulated'\n",
            "discovery.backends: expected a list of: simulated, nvidia, ascend, hygon, cambricon, "
            "auto",
            id="list",
        ),
        pytest.param(
            "[discovery]\nbackends = ['nvidai']\n",
            r"discovery.backends: expected a list of: .*, got \['nvidai'\]",
            id="backend-name",
        ),
        pytest.param(
            "[discovery]\nhotplug = 'yes'\n",
            "discovery.hotplug: expected true or false",
            id="boolean",
        ),
        pytest.param(
            "[runtime]\nplugin_index = '1'\n",
            'runtime.plugin_index: expected two digits such as "10"',
            id="index-short",
        ),
        pytest.param(
            "[runtime]\nplugin_index = 10\n",
            "runtime.plugin_index: expected two digits",
            id="index-int",
        ),
        pytest.param(
            "[runtime.driver_paths]\nnvidia = '/usr/local/nvidia'\n",
            "runtime.driver_paths.nvidia: expected a list of absolute paths",
            id="paths-not-list",
        ),
        pytest.param(
            "[runtime.driver_paths]\nascend = ['lib64']\n",
            r"runtime.driver_paths.ascend: expected a list of absolute paths, got \['lib64'\]",
            id="paths-relative",
        ),
        pytest.param(
            "[health]\nsubhealth_score = 20\n",
            r"health.subhealth_score: 20 is under unhealthy_below \(30\)",
            id="subhealth-score-under-unhealthy",
        ),
        pytest.param(
            "[health]\nsubhealth_ignore = ['pcie-link-x8-of-x16']\n",
            "health.subhealth_ignore: expected a list of: pcie-link-width, pcie-link-speed",
            id="subhealth-ignore-unknown-reason",
        ),
        pytest.param(
            "[health]\nrules = 'x'\n",
            r"health.rules: expected a list of tables \{vendor, code, severity, pattern\}",
            id="rules-type",
        ),
        pytest.param(
            "[health]\nrules = [{vendor = 'nvidia'}]\n",
            r"health.rules: health rule #0: missing key\(s\) code, pattern, severity",
            id="rules-missing",
        ),
        pytest.param(
            f"[health]\nrules = [{RULE[:-1]}, note = 'x'}}]\n",
            r"health.rules: health rule #0: unknown key\(s\) note",
            id="rules-unknown",
        ),
        pytest.param(
            f"[health]\nrules = [{RULE.replace(chr(39) + 'fatal' + chr(39), '3')}]\n",
            "health.rules: health rule #0: severity must be a string",
            id="rules-type-value",
        ),
        pytest.param(
            f"[health]\nrules = [{RULE.replace('(?P<bus>[0-9:.]+)', '(x')}]\n",
            "health.rules: health rule #0: missing",
            id="rules-regex",
        ),
        pytest.param(
            f"[health]\nrules = [{RULE.replace('(?P<bus>[0-9:.]+)', 'x')}]\n",
            r"health rule #0: the pattern needs a \(\?P<bus>...\) group",
            id="rules-no-bus",
        ),
        pytest.param(
            "[runtime]\nruntime_units = ['containerd']\n",
            r"runtime\.runtime_units: expected systemd unit names such as "
            r"\"containerd\.service\", got 'containerd'",
            id="unit-without-type",
        ),
        pytest.param(
            "[runtime]\nruntime_units = ['crio service']\n",
            r"runtime\.runtime_units: .* got 'crio service'",
            id="unit-with-space",
        ),
    ],
)
def test_bad_config_is_refused_with_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    [line] = caught.value.lines
    assert line.startswith(f"{tmp_path / 'hcsd.toml'}: ")
    assert re.search(message, line), line


def test_a_good_rule_is_accepted(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, f"[health]\nrules = [{RULE}]\n"))
    assert config.health.rules[0]["code"] == "x"
    assert len(config.health.line_rules()) == len(Config().health.line_rules()) + 1


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[daemon]\nsocket = 'x'\nshutdown_grace = 0\n[alocator]\n"
        "[runtime.driver_paths]\nnvidia = ['rel']\n",
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    keys = [line.split(": ")[1] for line in caught.value.lines]
    assert keys == [
        "alocator",
        "daemon.socket",
        "daemon.shutdown_grace",
        "runtime.driver_paths.nvidia",
    ]
    assert all(line.startswith(f"{path}: ") for line in caught.value.lines)


def test_default_config_documents_every_key_and_parses_to_the_defaults(tmp_path: Path) -> None:
    text = render_default_config()
    for table in tables(Config):
        assert f"\n[{table.name}]\n" in text
        for s in table.settings:
            assert f"\n#{s.name} = " in text
    uncommented = re.sub(r"^#(\w+ = )", r"\1", text, flags=re.MULTILINE)
    assert tomllib.loads(uncommented)["daemon"]["socket"] == "/run/hcsd/api/hcsd.sock"
    assert load_config(write(tmp_path, uncommented)) == Config()


def test_every_key_is_documented_and_checked() -> None:
    seen = set()
    for table in tables(Config):
        assert table.doc, table.name
        for s in table.settings:
            key = f"{table.name}.{s.name}"
            assert key not in seen
            seen.add(key)
            assert s.doc.endswith("."), key
            assert s.check.accepts, key
            assert s.check(s.as_written) == s.default, key
    assert len(seen) == len(values(Config()))


def test_driver_paths_name_every_vendor() -> None:
    from hcsd.model import Vendor

    fields = {f.name for f in dataclasses.fields(DriverPaths)}
    sections = {"ascend_files", "cambricon_files", "library_path", "nvidia_files"}
    assert fields - sections == {v.value for v in Vendor}
    libraries = {f.name for f in dataclasses.fields(LibraryPaths)}
    assert libraries == {v.value for v in Vendor}
    assert DriverPaths().of(Vendor.CAMBRICON) == ()  # its device plugin mounts no directory


def test_every_backend_name_has_a_factory() -> None:
    from hcsd.daemon.discovering import BACKENDS
    from hcsd.discovery.settings import BACKEND_NAMES

    assert set(BACKENDS) == set(BACKEND_NAMES)


def test_sections_built_in_code_are_checked_and_normalised(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match='plugin_index: expected two digits such as "10"'):
        RuntimeSection(plugin_index="1")
    built = DriverPaths(nvidia=[tmp_path])  # type: ignore[arg-type]
    assert built.nvidia == (str(tmp_path),)


def test_restart_needed_lists_non_reloadable_changes(tmp_path: Path) -> None:
    old = load_config(write(tmp_path, "[allocator]\npolicy = 'binpack'\n"))
    new = load_config(
        write(
            tmp_path,
            "[allocator]\npolicy = 'spread'\n[daemon]\nsocket = '/tmp/x.sock'\n"
            "log_level = 'debug'\n[runtime.driver_paths]\nhygon = []\n",
        )
    )
    assert old.restart_needed(new) == ["daemon.socket", "runtime.driver_paths.hygon"]
    assert old.restart_needed(old) == []


def test_reload_takes_only_the_reloadable_keys(tmp_path: Path) -> None:
    old = load_config(write(tmp_path, "[daemon]\nlog_level = 'info'\n"))
    new = load_config(
        write(
            tmp_path,
            "[daemon]\nlog_level = 'debug'\nsocket = '/tmp/x.sock'\n[allocator]\n"
            "policy = 'spread'\n[runtime.driver_paths]\nnvidia = []\n",
        )
    )
    merged = merge_reloadable(old, new)
    assert merged.daemon.log_level == "debug"
    assert merged.allocator.policy is SpreadPolicy.SPREAD
    assert merged.daemon.socket == "/run/hcsd/api/hcsd.sock"
    assert merged.runtime.driver_paths.nvidia == ("/usr/local/nvidia",)


def test_every_reloadable_key_has_a_reload_step() -> None:
    from hcsd.daemon.config import reloadable_keys
    from hcsd.daemon.lifecycle import RELOAD_STEPS

    assert (
        set(RELOAD_STEPS)
        == reloadable_keys()
        == {
            "daemon.log_level",
            "allocator.policy",
            "node.mode",
        }
    )


def test_the_simulated_run_config_still_loads(tmp_path: Path) -> None:
    """scripts/run-simulated writes its own file (make run): it must stay valid."""
    script = (ROOT / "scripts" / "run-simulated").read_text()
    body = script.split("<<TOML\n", 1)[1].split("\nTOML\n", 1)[0]
    text = body.replace("$run", str(tmp_path)).replace("$top", str(ROOT))
    config = load_config(write(tmp_path, text.replace("$port", "9400")), required=True)
    assert config.runtime.nri is False
    assert config.discovery.simulated_node == f"{ROOT}/examples/nodes/mixed.toml"
