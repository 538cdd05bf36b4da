"""docs/compatibility.md against the checks that write it (fast, no cluster): the checked-in
report must be what the generator writes for its own rows, hold exactly the checks of
tests/kubelet/compatibility.py for every vendor and profile, and every row must have passed.
The slow test (test_compatibility.py) compares it with a real run; this one keeps it from
going stale where the cluster cannot run, and the tables below show each way it can fail."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from tests.kubelet import compatibility as report
from tests.kubelet.compatibility import PASS, Result


def passing() -> list[Result]:
    return [Result(v, p, what, how, PASS) for v, p, what, how in report.expected_rows()]


def test_the_checked_in_report_is_current_and_every_row_passed() -> None:
    if not report.crd_shipped() and not report.DOC.exists():
        pytest.skip(
            f"SKIP docs/compatibility.md: packaging/kubernetes does not install {report.CRD} "
            "yet (issue 20's cluster side), so there is no report to keep current"
        )
    assert report.DOC.exists(), "docs/compatibility.md is missing: make compatibility-report"
    assert report.problems(report.DOC.read_text()) == []


def test_parse_reads_back_what_render_wrote() -> None:
    results = passing()
    results[3] = dataclasses.replace(results[3], outcome="FAIL: saw 'a | b', wanted 'c'")
    assert report.parse(report.render(results)) == results


def _failed(results: list[Result]) -> list[Result]:
    return [dataclasses.replace(results[0], outcome="FAIL: saw None"), *results[1:]]


def _edited(text: str) -> str:
    """The prose changed (a row changed by hand is a row: it is judged as one)."""
    assert "**Not run here:**" in text
    return text.replace("**Not run here:**", "**Also run:**")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        pytest.param(lambda rs: rs, None, id="current"),
        pytest.param(_failed, "FAIL: saw None", id="a-row-failed"),
        pytest.param(lambda rs: rs[1:], "not the checks of compatibility.py", id="a-check-missing"),
        pytest.param(
            lambda rs: [dataclasses.replace(rs[0], how="by looking"), *rs[1:]],
            "not the checks of compatibility.py",
            id="a-check-described-otherwise",
        ),
    ],
)
def test_problems_name_what_makes_a_report_stale(
    change: Callable[[list[Result]], list[Result]], problem: str | None
) -> None:
    found = report.problems(report.render(change(passing())))
    assert (found == []) if problem is None else any(problem in f for f in found), found


def test_a_report_edited_by_hand_is_refused() -> None:
    found = report.problems(_edited(report.render(passing())))
    assert any("edited by hand" in f for f in found), found
