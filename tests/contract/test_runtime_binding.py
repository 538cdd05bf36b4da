"""The resolved RuntimeProfile in the signed assignment (version 3): what the extender records
at bind is what hcsd reads back, only under the signature, and malformed text is refused
with a message that names the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hcsd.contract.assignment import (
    RUNTIME_VERSION,
    Assignment,
    AssignmentError,
    build,
    encode,
    parse,
    sign,
    verify,
)
from hcsd.contract.runtime_binding import ResolvedRuntime, RuntimeBindingError, dump, load
from hcsd.model import Grant

KEY = b"r" * 32
NOW = 1_763_800_000.0
GRANTS = {"main": (Grant("GPU-a", 2**34, 0),), "sidecar": ()}
SERVE = ResolvedRuntime(
    profile="pytorch-2.5",
    image="nvcr.io/nvidia/pytorch:24.10-py3",
    env=(("HCS_PROFILE", "pytorch-2.5"), ("LD_LIBRARY_PATH", "/opt/trt/lib")),
    command=("python3", "-m", "serve"),
    args=("--port", "8000"),
    code_mount="/workspace",
)
ASSIGNMENT = Assignment("node-1", "uid-1", NOW, GRANTS, "k1", {"main": SERVE})


def check(text: str) -> Assignment:
    return verify(text, {"k1": KEY}, node="node-1", pod_uid="uid-1", now=NOW, max_age=600.0)


def test_a_resolved_profile_round_trips_under_the_signature() -> None:
    text = encode(ASSIGNMENT, KEY)
    body = json.loads(text)
    assert body["v"] == RUNTIME_VERSION
    assert body["runtime"]["main"]["command"] == ["python3", "-m", "serve"]
    got = check(text)
    assert got == ASSIGNMENT
    assert got.runtime["main"].argv() == ("python3", "-m", "serve", "--port", "8000")
    assert parse(text).runtime["main"] == SERVE


def test_pods_without_a_profile_keep_version_2() -> None:
    """Only pods that use a profile are refused by an older node."""
    plain = Assignment("node-1", "uid-1", NOW, GRANTS, "k1")
    body = json.loads(encode(plain, KEY))
    assert body["v"] == 2
    assert "runtime" not in body
    assert check(encode(plain, KEY)).runtime == {}


def test_the_profile_is_covered_by_the_signature() -> None:
    body = json.loads(encode(ASSIGNMENT, KEY))
    body["runtime"]["main"]["image"] = "evil.example/miner:latest"
    with pytest.raises(AssignmentError, match="does not verify"):
        check(json.dumps(body))


def resigned(change: dict[str, Any]) -> str:
    body = json.loads(encode(ASSIGNMENT, KEY))
    body.update(change)
    return sign(body, KEY)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"v": 2}, "'runtime' needs version 3"),
        ({"runtime": {}}, "version 3 without a runtime profile"),
        ({"runtime": []}, "keyed by container name"),
        ({"runtime": {"ghost": dump(SERVE)}}, "containers without grants"),
        ({"runtime": {"main": {**dump(SERVE), "image": ""}}}, "not an image name"),
        ({"runtime": {"main": {**dump(SERVE), "image": "a b"}}}, "not an image name"),
        ({"runtime": {"main": {**dump(SERVE), "profile": "Bad_Name"}}}, "not a name"),
        ({"runtime": {"main": {**dump(SERVE), "env": [["1BAD", "x"]]}}}, "not a variable name"),
        ({"runtime": {"main": {**dump(SERVE), "env": [["A", "x"], ["A", "y"]]}}}, "twice"),
        ({"runtime": {"main": {**dump(SERVE), "env": [["A"]]}}}, "pairs"),
        ({"runtime": {"main": {**dump(SERVE), "env": [["A", 1]]}}}, "env value"),
        ({"runtime": {"main": {**dump(SERVE), "command": "python3"}}}, "command must be a list"),
        ({"runtime": {"main": {**dump(SERVE), "command": ["x"] * 65}}}, "at most 64"),
        ({"runtime": {"main": {**dump(SERVE), "args": ["a\0b"]}}}, "NUL"),
        ({"runtime": {"main": {**dump(SERVE), "code_mount": "work"}}}, "not absolute"),
    ],
)
def test_malformed_profiles_are_refused_with_the_field_named(
    change: dict[str, Any], message: str
) -> None:
    text = resigned(change)
    with pytest.raises(AssignmentError, match=message):
        check(text)
    with pytest.raises(AssignmentError, match=message):
        parse(text)


def test_args_without_a_command_are_refused() -> None:
    raw = {**dump(SERVE)}
    del raw["command"]
    with pytest.raises(RuntimeBindingError, match="need a command"):
        load(raw)


def test_building_a_profile_needs_a_key_id_and_a_granted_container() -> None:
    with pytest.raises(ValueError, match="names its key"):
        build("node-1", "uid-1", NOW, GRANTS, "", runtime={"main": SERVE})
    with pytest.raises(ValueError, match="without grants"):
        build("node-1", "uid-1", NOW, GRANTS, "k1", runtime={"ghost": SERVE})


def test_no_command_keeps_the_runtimes_argv() -> None:
    env_only = ResolvedRuntime("pytorch-2.5", "img:1", (("A", "1"),))
    assert env_only.argv() is None
    assert load(dump(env_only)) == env_only
