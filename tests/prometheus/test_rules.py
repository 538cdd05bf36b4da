"""The rule file as promtool reads it: valid, and every alert and recording rule meets its
unit test (tests/prometheus/rules_test.yaml)."""

from __future__ import annotations

import subprocess
from pathlib import Path

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
