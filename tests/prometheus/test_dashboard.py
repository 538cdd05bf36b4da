"""What the live test asks of the dashboard: every query of every panel, wherever it sits."""

from __future__ import annotations

from tests.harness.prometheus import panel_queries


def test_panels_in_collapsed_rows_are_found() -> None:
    dashboard = {
        "panels": [
            {"type": "stat", "title": "top", "targets": [{"expr": "a"}]},
            {"type": "row", "title": "open row", "collapsed": False, "panels": []},
            {
                "type": "row",
                "title": "collapsed row",
                "collapsed": True,
                "panels": [
                    {
                        "type": "timeseries",
                        "title": "inner",
                        "targets": [{"expr": "b"}, {"expr": "c"}],
                    }
                ],
            },
        ]
    }
    assert panel_queries(dashboard) == [("top", "a"), ("inner", "b"), ("inner", "c")]


def test_the_shipped_dashboard_has_queries() -> None:
    titles = {title for title, _ in panel_queries()}
    assert {"Pending accelerator pods", "Devices not healthy per node"} <= titles
