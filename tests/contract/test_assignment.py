"""The signed `hcs.io/assignment` annotation: what the extender writes is what hcsd verifies."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hcsd.contract.assignment import (
    MAX_BYTES,
    Assignment,
    AssignmentError,
    build,
    encode,
    parse,
    sign,
    verify,
)
from hcsd.model import Grant

KEY = b"k" * 32
KEYS = {"": KEY}  # version 1 assignments name no key id: verified with the key under ""
NOW = 1_763_800_000.0
GiB = 2**30
GRANTS = {
    "main": (Grant("GPU-a", 16 * GiB, 25), Grant("GPU-b", 16 * GiB, 0)),
    "sidecar": (),
}
ASSIGNMENT = Assignment("node-1", "uid-1", NOW, GRANTS)


def check(text: str, **overrides: Any) -> Assignment:
    where: dict[str, Any] = {"node": "node-1", "pod_uid": "uid-1", "now": NOW, "max_age": 600.0}
    where.update(overrides)
    keys = where.pop("keys", KEYS)
    return verify(text, keys, **where)


def resigned(change: dict[str, Any], key: bytes = KEY) -> str:
    """The genuine assignment with fields changed and signed again (by the key holder)."""
    body = json.loads(encode(ASSIGNMENT, KEY))
    body.update(change)
    return sign(body, key)


def test_round_trip() -> None:
    text = encode(ASSIGNMENT, KEY)
    assert check(text) == ASSIGNMENT
    assert parse(text) == ASSIGNMENT


def test_the_wire_format_is_the_one_hcsd_has_always_verified() -> None:
    """The extender's bind wrote this JSON inline before; nodes running an older hcsd must
    keep verifying what a newer extender signs, and the other way round (the value is what
    the signing code before this package produced)."""
    body = build("node-1", "uid-1", 1763800000.9, {"main": (Grant("GPU-a", 1024, 0),)})
    assert body == {
        "v": 1,
        "node": "node-1",
        "pod_uid": "uid-1",
        "issued": 1763800000,
        "containers": {"main": [{"uuid": "GPU-a", "vram": 1024, "compute": 0}]},
    }
    assert sign(body, KEY) == (
        '{"containers":{"main":[{"compute":0,"uuid":"GPU-a","vram":1024}]},"issued":1763800000,'
        '"node":"node-1","pod_uid":"uid-1",'
        '"sig":"16435daa8c6cd8a9a25c7e806001f8c76cb27bbc5c1870cde5826a5ce25d01d8","v":1}'
    )


V2 = Assignment("node-1", "uid-1", NOW, GRANTS, "k2")


def test_version_2_names_its_key_and_is_verified_with_that_key() -> None:
    """Version 2 (key ids) is what the extender signs; the golden value pins the wire format
    (canonical JSON, HMAC-SHA256 over it without `sig`) for nodes of other releases."""
    body = build("node-1", "uid-1", 1763800000.9, {"main": (Grant("GPU-a", 1024, 0),)}, "k2")
    assert body["v"] == 2
    assert body["kid"] == "k2"
    assert sign(body, KEY) == (
        '{"containers":{"main":[{"compute":0,"uuid":"GPU-a","vram":1024}]},"issued":1763800000,'
        '"kid":"k2","node":"node-1","pod_uid":"uid-1",'
        '"sig":"' + _hmac_hex(body) + '","v":2}'
    )
    text = encode(V2, KEY)
    ring = {"k1": b"o" * 32, "k2": KEY}
    assert check(text, keys=ring) == V2
    assert parse(text).kid == "k2"
    with pytest.raises(AssignmentError, match="key id 'k2', which this node does not hold"):
        check(text, keys={"k1": KEY})
    with pytest.raises(AssignmentError, match="does not verify"):
        check(text, keys={"k2": b"o" * 32})


def _hmac_hex(body: dict[str, Any]) -> str:
    """An independent HMAC over the canonical body, as the format's docstring defines it."""
    import hashlib
    import hmac

    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(KEY, canonical, hashlib.sha256).hexdigest()


def tampered(path: tuple[Any, ...], value: Any) -> str:
    body = json.loads(encode(ASSIGNMENT, KEY))
    target = body
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return json.dumps(body)


@pytest.mark.parametrize(
    ("text", "overrides", "message"),
    [
        pytest.param(
            tampered(("containers", "main", 0, "vram"), 80 * GiB),
            {},
            "does not verify",
            id="more-vram",
        ),
        pytest.param(tampered(("node",), "node-2"), {"node": "node-2"}, "does not verify", id="n"),
        pytest.param(encode(ASSIGNMENT, b"x" * 32), {}, "does not verify", id="other-key"),
        pytest.param(encode(ASSIGNMENT, KEY), {"node": "node-2"}, "for node node-1", id="node"),
        pytest.param(encode(ASSIGNMENT, KEY), {"pod_uid": "uid-2"}, "not uid-2", id="pod-uid"),
        pytest.param(encode(ASSIGNMENT, KEY), {"now": NOW + 601}, "is stale", id="stale"),
        pytest.param(encode(ASSIGNMENT, KEY), {"now": NOW - 301}, "in the future", id="future"),
        pytest.param(encode(ASSIGNMENT, KEY), {"keys": {}}, "no assignment key", id="no-key"),
        pytest.param(
            encode(ASSIGNMENT, KEY), {"keys": {"k1": KEY}}, "key id ''", id="v1-no-legacy-key"
        ),
        pytest.param(
            tampered(("sig",), "\u00e9" * 64), {}, "not 64 lower-case hex", id="non-ascii"
        ),
        pytest.param(tampered(("sig",), "A" * 64), {}, "not 64 lower-case hex", id="upper-case"),
        pytest.param(tampered(("sig",), "ab"), {}, "not 64 lower-case hex", id="short-sig"),
        pytest.param(tampered(("sig",), 7), {}, "has no signature", id="numeric-sig"),
        pytest.param("{not json", {}, "not JSON", id="not-json"),
        pytest.param("[" * 50_000, {}, "not JSON", id="nested-too-deep"),
        pytest.param("[]", {}, "not a JSON object", id="array"),
        pytest.param(" " * (MAX_BYTES + 1), {}, "larger than", id="huge"),
        pytest.param(resigned({"v": 4}), {}, "version 4", id="version"),
        pytest.param(resigned({"v": 2}), {}, "'kid' must be a str", id="v2-without-kid"),
        pytest.param(resigned({"v": 2, "kid": "../k"}), {}, "is not a key id", id="v2-odd-kid"),
        pytest.param(resigned({"v": True}), {}, "version True", id="bool-version"),
        pytest.param(resigned({"issued": float("nan")}), {}, "finite", id="nan-never-stale"),
        pytest.param(resigned({"issued": "soon"}), {}, "finite", id="text-issued"),
        pytest.param(resigned({"node": 7}), {}, "'node' must be a str", id="numeric-node"),
        pytest.param(resigned({"containers": []}), {}, "'containers' must be a dict", id="c"),
        pytest.param(
            resigned({"containers": {"main": [{"uuid": "GPU-a"}]}}), {}, "'vram'", id="no-vram"
        ),
        pytest.param(
            resigned({"containers": {"main": [{"uuid": "GPU-a", "vram": 1, "compute": 101}]}}),
            {},
            "out of range",
            id="compute-over-100",
        ),
        pytest.param(
            resigned({"containers": {"main": [{"uuid": "GPU-a", "vram": True}]}}),
            {},
            "'vram' must be a int",
            id="bool-vram",
        ),
        pytest.param(resigned({"containers": {"main": "GPU-a"}}), {}, "needs a list", id="str"),
    ],
)
def test_every_bad_assignment_is_an_assignment_error(
    text: str, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(AssignmentError, match=message):
        check(text, **overrides)


def test_parse_reads_without_the_key_but_checks_the_form() -> None:
    """The extender's informer: what bound pods hold, from annotations it signed."""
    assert parse(tampered(("sig",), "0" * 64)).containers == GRANTS
    with pytest.raises(AssignmentError, match="'pod_uid' must be a str"):
        parse('{"v": 1, "node": "n", "issued": 1, "containers": {}}')


def test_assignment_errors_are_value_errors() -> None:
    """The extender's informer skips objects whose transform raises ValueError."""
    assert issubclass(AssignmentError, ValueError)
