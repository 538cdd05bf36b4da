"""The rule file as promtool reads it: valid, and every alert and recording rule meets its
unit test (tests/prometheus/rules_test.yaml); and the unit tests can fail: each alert with its
`for:` dropped or halved, and each of its thresholds moved halfway to either side, must fail
them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.prometheus import RULES, find

TESTS = Path(__file__).with_name("rules_test.yaml")


@pytest.fixture(scope="module")
def promtool() -> str:
    found = find("promtool")
    if found is None:
        pytest.skip(
            "SKIP prometheus rule tests: promtool is not installed (apt install prometheus)"
        )
    return found


def test_the_rules_check(promtool: str) -> None:
    result = subprocess.run(
        [promtool, "check", "rules", str(RULES)], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_meet_their_unit_tests(promtool: str) -> None:
    result = subprocess.run(
        [promtool, "test", "rules", str(TESTS)], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_and_recording_rule_has_a_unit_test() -> None:
    rules = [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]
    cases = yaml.safe_load(TESTS.read_text())["tests"]
    alerts = {check["alertname"] for case in cases for check in case.get("alert_rule_test", [])}
    recorded = {check["expr"] for case in cases for check in case.get("promql_expr_test", [])}
    assert {r["alert"] for r in rules if "alert" in r} == alerts
    assert {r["record"] for r in rules if "record" in r} == recorded


# A comparison with a number in an alert's expression: `> 0.05`, `== 1`, `> 0`.
THRESHOLD = re.compile(r"(>=|<=|==|!=|>|<)\s*(-?[0-9.]+)(?![0-9.]*[a-z\]])")


def _seconds(duration: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smh])", duration))


def _moved(value: str) -> list[str]:
    number = float(value)
    if number == 0:
        return ["-1", "1"]
    return [repr(number / 2), repr(number * 2)]


def mutants() -> list[Any]:
    """(alert, what changed, changed rule): the rule with its `for:` gone or halved, or
    one threshold moved to half or twice its value (0 to -1 and 1)."""
    found = []
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            name = rule["alert"]
            if "for" in rule:
                found.append(pytest.param(name, {k: v for k, v in rule.items() if k != "for"},
                                          id=f"{name}-no-for"))  # fmt: skip
                half = f"{_seconds(rule['for']) // 2}s"
                found.append(pytest.param(name, {**rule, "for": half}, id=f"{name}-for-{half}"))
            for match in THRESHOLD.finditer(rule["expr"]):
                for value in _moved(match[2]):
                    expr = (rule["expr"][: match.start(2)] + value
                            + rule["expr"][match.end(2) :])  # fmt: skip
                    found.append(pytest.param(name, {**rule, "expr": expr},
                                              id=f"{name}-{match[1]}{value}"))  # fmt: skip
    return found


@pytest.mark.parametrize(("alert", "changed"), mutants())
def test_the_unit_tests_fail_for_a_changed_rule(
    promtool: str, tmp_path: Path, alert: str, changed: dict[str, Any]
) -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    for group in groups:
        group["rules"] = [changed if r.get("alert") == alert else r for r in group["rules"]]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    tests = yaml.safe_load(TESTS.read_text())
    tests["rule_files"] = [str(rules)]
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [promtool, "test", "rules", str(path)], check=False, capture_output=True, text=True
    )
    assert result.returncode != 0, f"the unit tests still pass with {alert} changed to {changed}"
    assert alert in result.stdout + result.stderr
