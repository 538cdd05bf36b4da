"""The checks a key's value passes: each says in words what it accepts (the docs and the error
messages use the same words) and returns the value normalised (lists as tuples, paths as str).

A check raises ValueError: with a message of its own when it knows more than "wrong type"
(which health rule is bad and why), else `expected <accepts>, got <value>` is said for it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from enum import Enum
from typing import Any, Generic, TypeVar

__all__ = [
    "Check",
    "boolean",
    "choice",
    "enum",
    "listen",
    "names",
    "path",
    "path_list",
    "path_or_empty",
    "percent",
    "positive_int",
    "score",
    "seconds",
    "string",
    "string_list",
    "two_digits",
    "unit_names",
]

T = TypeVar("T")
E = TypeVar("E", bound=Enum)


class Check(Generic[T]):
    """A named check of one value; `accepts` completes "expected …"."""

    __slots__ = ("accepts", "convert")

    def __init__(self, accepts: str, convert: Callable[[Any], T]) -> None:
        self.accepts = accepts
        self.convert = convert

    def __call__(self, value: Any) -> T:
        try:
            return self.convert(value)
        except ValueError as e:
            if str(e):
                raise
            raise ValueError(f"expected {self.accepts}, got {value!r}") from None

    def __repr__(self) -> str:
        return f"Check({self.accepts!r})"


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError
    return value


def _path(value: Any, *, empty: bool) -> str:
    text = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(text, str) or ((text or not empty) and not text.startswith("/")):
        raise ValueError
    return text


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError
    return value


def _number(value: Any, low: float, high: float, *, with_low: bool = False) -> float:
    """A number in (low, high], or in [low, high] `with_low`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError
    if value > high or value < low or (value == low and not with_low):
        raise ValueError
    return float(value)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError
    return value


def _listen(value: Any) -> str:
    text = _string(value)
    if text:
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError
    return text


def _two_digits(value: Any) -> str:
    if not isinstance(value, str) or len(value) != 2 or not (value.isascii() and value.isdigit()):
        raise ValueError
    return value


def _list_of(item: Callable[[Any], str]) -> Callable[[Any], tuple[str, ...]]:
    def convert(value: Any) -> tuple[str, ...]:
        if not isinstance(value, list | tuple):
            raise ValueError
        return tuple(item(v) for v in value)

    return convert


# systemd.unit(5): NAME[@INSTANCE].TYPE of letters, digits and ":-_.\\", at most 255 characters.
_UNIT_TYPES = "service|socket|device|mount|automount|swap|target|path|timer|slice|scope"
_UNIT_NAME = re.compile(rf"[A-Za-z0-9:_.\\-]+(@[A-Za-z0-9:_.\\-]+)?\.({_UNIT_TYPES})")


def _unit_name(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 255 or not _UNIT_NAME.fullmatch(value):
        raise ValueError(f'expected systemd unit names such as "containerd.service", got {value!r}')
    return value


def _non_empty(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError
    return value


def choice(*choices: str) -> Check[str]:
    def convert(value: Any) -> str:
        if value not in choices:
            raise ValueError
        return str(value)

    return Check(f"one of {', '.join(choices)}", convert)


def names(*allowed: str) -> Check[tuple[str, ...]]:
    """A list of names, each one of `allowed` (a typo is refused before anything starts)."""

    def convert(value: Any) -> tuple[str, ...]:
        if not isinstance(value, list | tuple) or any(v not in allowed for v in value):
            raise ValueError
        return tuple(value)

    return Check(f"a list of: {', '.join(allowed)}", convert)


def enum(kind: type[E]) -> Check[E]:
    """A value of a string enum, written in the file as its value."""
    names = [member.value for member in kind]

    def convert(value: Any) -> E:
        if isinstance(value, kind):
            return value
        if value not in names:
            raise ValueError
        return kind(value)

    return Check(f"one of {', '.join(names)}", convert)


string = Check("a string", _string)
path = Check("an absolute path", lambda v: _path(v, empty=False))
path_or_empty = Check("an absolute path or an empty string", lambda v: _path(v, empty=True))
path_list = Check("a list of absolute paths", _list_of(lambda v: _path(v, empty=False)))
string_list = Check("a list of non-empty strings", _list_of(_non_empty))
unit_names = Check(
    'a list of systemd unit names such as "containerd.service"', _list_of(_unit_name)
)
positive_int = Check("a positive integer", _positive_int)
seconds = Check("a positive number of seconds", lambda v: _number(v, 0.0, float("inf")))
score = Check("a score in (0, 100]", lambda v: _number(v, 0.0, 100.0))
percent = Check("a percentage in [0, 100]", lambda v: _number(v, 0.0, 100.0, with_low=True))
boolean = Check("true or false", _boolean)
listen = Check("HOST:PORT (or an empty string to disable)", _listen)
two_digits = Check('two digits such as "10"', _two_digits)
