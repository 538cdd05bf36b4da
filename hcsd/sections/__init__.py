"""Configuration sections declared once (`declaring`) and the checks their keys pass (`checks`)."""

from hcsd.sections.declaring import (
    Problem,
    Section,
    Setting,
    Table,
    merge_reloadable,
    read_section,
    section,
    setting,
    tables,
    values,
)

__all__ = [
    "Problem",
    "Section",
    "Setting",
    "Table",
    "merge_reloadable",
    "read_section",
    "section",
    "setting",
    "tables",
    "values",
]
