"""Configuration sections declared once: a key is one dataclass field that carries its default,
its documentation, its check and whether SIGHUP applies it.

A part declares the section it is configured with next to its own code and takes that object in
its constructor, so the part has no defaults of its own to drift. The daemon gathers the
sections into the file's schema (`hcsd.daemon.config.Config`); reading the file, the default
file, `--check-config`, the man page and docs/configuration.md all walk the same fields.

A section checks its values when it is built, from a file or from code, so a part never sees a
value its section would refuse. Reading a file reports every problem at once, each with its
key, rather than stopping at the first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from hcsd.sections.checks import Check

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

T = TypeVar("T")
S = TypeVar("S", bound="Section")

_SETTING = "hcs.setting"
_SECTION = "hcs.section"


@dataclass(frozen=True, slots=True)
class Setting:
    """One key: what the docs, the default file and the checks need to know about it."""

    name: str
    default: Any
    doc: str
    check: Check[Any]
    reload: bool
    as_written: Any  # the default as the file and the docs show it


@dataclass(frozen=True, slots=True)
class _Meta(Generic[T]):
    doc: str
    check: Check[T]
    reload: bool
    as_written: Any


def setting(
    default: T, doc: str, check: Check[T], *, reload: bool = False, as_written: Any = None
) -> T:
    """A key of a section: `reload` says whether SIGHUP applies a change (else: a restart);
    `as_written` is the default as a person writes it, where that differs from the value
    (`"1Gi"` for 1073741824)."""
    written = default if as_written is None else as_written
    if check(written) != default:  # a bug to find at import, not in a file
        raise ValueError(f"the default {written!r} does not pass its own check as {default!r}")
    return field(default=default, metadata={_SETTING: _Meta(doc, check, reload, written)})


def section(cls: type[S], doc: str) -> S:
    """A nested section: a TOML table of its own (`[runtime.driver_paths]`), all defaults."""
    return field(default_factory=cls, metadata={_SECTION: doc})


class Section:
    """Base of every section. Each value is checked (and normalised: lists become tuples,
    paths strings) when the section is built, so an object of a section is always valid."""

    __slots__ = ()

    def __post_init__(self) -> None:
        for item in _settings(type(self)):
            try:
                value = item.check(getattr(self, item.name))
            except ValueError as e:
                raise ValueError(f"{item.name}: {e}") from None
            object.__setattr__(self, item.name, value)


def _settings(cls: type[Section]) -> Iterator[Setting]:
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        meta = f.metadata.get(_SETTING)
        if meta is not None:
            yield Setting(f.name, f.default, meta.doc, meta.check, meta.reload, meta.as_written)


def _subsections(cls: type[Section]) -> Iterator[tuple[str, type[Section], str]]:
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        doc = f.metadata.get(_SECTION)
        if doc is not None:
            yield f.name, f.default_factory, doc  # type: ignore[misc]


@dataclass(frozen=True, slots=True)
class Table:
    """A section as the file shows it: its dotted name, its doc and its own keys."""

    name: str
    doc: str
    settings: tuple[Setting, ...]


def tables(cls: type[Section], prefix: str = "", doc: str = "") -> Iterator[Table]:
    """Every table of a section, parents before their nested tables, in declaration order."""
    own = tuple(_settings(cls))
    if own or prefix:
        yield Table(prefix, doc, own)
    for name, sub, sub_doc in _subsections(cls):
        yield from tables(sub, f"{prefix}.{name}" if prefix else name, sub_doc)


def values(instance: Section, prefix: str = "") -> dict[str, Any]:
    """Every key of a section and its nested sections, by dotted name."""
    result = {f"{prefix}{s.name}": getattr(instance, s.name) for s in _settings(type(instance))}
    for name, _, _ in _subsections(type(instance)):
        result.update(values(getattr(instance, name), f"{prefix}{name}."))
    return result


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong in a file, with the dotted key it is about."""

    key: str
    message: str


def read_section(
    cls: type[S], table: Mapping[str, Any], prefix: str = ""
) -> tuple[S | None, list[Problem]]:
    """Build a section from a parsed TOML table: the section, or None and every problem."""
    problems: list[Problem] = []
    own = {s.name: s for s in _settings(cls)}
    nested = {name: sub for name, sub, _ in _subsections(cls)}
    for name in table:
        if name not in own and name not in nested:
            known = ", ".join(sorted([*own, *nested]))
            what = "key" if prefix else "section"
            problems.append(Problem(prefix + name, f"unknown {what} (known: {known})"))
    arguments: dict[str, Any] = {}
    for name, item in own.items():
        if name in table:
            try:
                arguments[name] = item.check(table[name])
            except ValueError as e:
                problems.append(Problem(prefix + name, str(e)))
    for name, sub in nested.items():
        if name not in table:
            continue
        if not isinstance(table[name], dict):
            problems.append(Problem(prefix + name, "must be a table"))
            continue
        built, more = read_section(sub, table[name], f"{prefix}{name}.")
        problems += more
        arguments[name] = built
    if problems:
        return None, problems
    try:
        return cls(**arguments), []
    except ValueError as e:  # a check across settings (a section's __post_init__): "name: why"
        name, _, why = str(e).partition(": ")
        if name in own:
            return None, [Problem(prefix + name, why)]
        return None, [Problem(prefix.rstrip(".") or cls.__name__, str(e))]


def merge_reloadable(old: S, new: S) -> S:
    """`old` with the keys that SIGHUP applies taken from `new`; the rest wait for a restart."""
    changes: dict[str, Any] = {
        s.name: getattr(new, s.name) for s in _settings(type(old)) if s.reload
    }
    for name, _, _ in _subsections(type(old)):
        changes[name] = merge_reloadable(getattr(old, name), getattr(new, name))
    return dataclasses.replace(old, **changes)  # type: ignore[type-var]
