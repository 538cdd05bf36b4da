"""The section machinery on a schema of its own: what a part gets by declaring a section."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hcsd.sections import (
    Problem,
    Section,
    checks,
    merge_reloadable,
    read_section,
    section,
    setting,
    tables,
    values,
)


@dataclass(frozen=True, slots=True)
class Limits(Section):
    interval: float = setting(5.0, "Seconds between polls.", checks.seconds, reload=True)
    paths: tuple[str, ...] = setting(("/a",), "Paths.", checks.path_list)


@dataclass(frozen=True, slots=True)
class Watchdog(Section):
    policy: str = setting("warn", "What to do.", checks.choice("warn", "kill"), reload=True)
    limits: Limits = section(Limits, "Limits.")


@dataclass(frozen=True, slots=True)
class Root(Section):
    watchdog: Watchdog = section(Watchdog, "A part added with one field here.")


def test_tables_walk_parents_before_nested_tables() -> None:
    listed = [(t.name, t.doc, [s.name for s in t.settings]) for t in tables(Root)]
    assert listed == [
        ("watchdog", "A part added with one field here.", ["policy"]),
        ("watchdog.limits", "Limits.", ["interval", "paths"]),
    ]


@pytest.mark.parametrize(
    ("raw", "problems"),
    [
        pytest.param({}, [], id="empty-means-defaults"),
        pytest.param({"watchdog": {"policy": "kill", "limits": {"interval": 1}}}, [], id="good"),
        pytest.param(
            {"watchdg": {}},
            [Problem("watchdg", "unknown section (known: watchdog)")],
            id="unknown-section",
        ),
        pytest.param(
            {"watchdog": {"limits": {"intervl": 1, "paths": ["rel"]}}},
            [
                Problem("watchdog.limits.intervl", "unknown key (known: interval, paths)"),
                Problem("watchdog.limits.paths", "expected a list of absolute paths, got ['rel']"),
            ],
            id="nested-problems-together",
        ),
        pytest.param(
            {"watchdog": {"limits": 3}},
            [Problem("watchdog.limits", "must be a table")],
            id="nested-not-a-table",
        ),
    ],
)
def test_read_section(raw: dict[str, object], problems: list[Problem]) -> None:
    built, found = read_section(Root, raw)
    assert found == problems
    assert (built is None) == bool(problems)


def test_values_are_normalised_and_flattened() -> None:
    built, _ = read_section(Root, {"watchdog": {"limits": {"interval": 2, "paths": ["/b"]}}})
    assert built is not None
    assert values(built) == {
        "watchdog.policy": "warn",
        "watchdog.limits.interval": 2.0,
        "watchdog.limits.paths": ("/b",),
    }


def test_merge_takes_only_reloadable_keys_at_every_depth() -> None:
    old = Root()
    new = Root(Watchdog("kill", Limits(interval=1.0, paths=("/new",))))
    merged = merge_reloadable(old, new)
    assert values(merged) == {
        "watchdog.policy": "kill",
        "watchdog.limits.interval": 1.0,
        "watchdog.limits.paths": ("/a",),
    }


def test_a_section_built_in_code_is_checked() -> None:
    with pytest.raises(ValueError, match="interval: expected a positive number of seconds"):
        Limits(interval=0)


def test_a_default_its_check_refuses_fails_at_declaration() -> None:
    with pytest.raises(ValueError, match="expected one of warn, kill, got 'maybe'"):
        setting("maybe", "Bad default.", checks.choice("warn", "kill"))
