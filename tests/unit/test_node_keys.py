"""The extender's side of key delivery without a cluster: the Secret read again on a clock,
callers refused before any API call, and TokenReview answers a real API server should never
give (faked). The TokenReview paths run against the real API server in
tests/cluster/test_node_identity.py."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from hcsd.cluster.kube import Kube
from hcsd.cluster.node_keys import (
    AUDIENCE,
    NODE_NAME_EXTRA,
    ClusterKeys,
    NodeKeys,
    Refused,
    syncer_user,
    token_expiry,
)
from hcsd.contract.keyring import Keyring, decode
from hcsd.contract.keys import AssignmentKeyError

K1 = b"a" * 44
K2 = b"b" * 44


def secret(directory: Path, files: dict[str, bytes]) -> None:
    directory.mkdir(exist_ok=True)
    for old in directory.iterdir():
        old.unlink()
    for name, value in files.items():
        (directory / name).write_bytes(value)
        (directory / name).chmod(0o400)


def test_the_secret_is_read_again_after_the_interval_and_a_bad_one_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    secret(tmp_path, {"k1.key": K1})
    keys = ClusterKeys(tmp_path, every=10, clock=lambda: now[0])
    assert keys() == Keyring({"k1": K1}, "k1")
    secret(tmp_path, {"k1.key": K1, "k2.key": K2, "signing": b"k2"})
    now[0] = 9.9
    assert keys().signing == "k1"  # not yet read again
    now[0] = 10
    assert keys() == Keyring({"k1": K1, "k2": K2}, "k2")
    secret(tmp_path, {"k1.key": K1, "k2.key": K2, "signing": b"k3"})  # an operator's slip
    now[0] = 20
    assert keys().signing == "k2"  # the last good keyring signs on
    assert "'k3' is not among the keys" in caplog.text


def test_an_unusable_secret_stops_the_extender_at_start(tmp_path: Path) -> None:
    secret(tmp_path, {"k1.key": b"REPLACE-WITH-32-RANDOM-BYTES"})
    with pytest.raises(AssignmentKeyError, match="placeholder"):
        ClusterKeys(tmp_path)


@pytest.mark.parametrize("authorization", ["", "Basic dXNlcjpwdw==", "Bearer ", "token"])
def test_a_caller_without_a_bearer_token_is_refused_unasked(
    tmp_path: Path, authorization: str
) -> None:
    """No TokenReview is made for them: the Kube here has no connection at all."""
    secret(tmp_path, {"k1.key": K1})
    node_keys = NodeKeys(Kube.__new__(Kube), ClusterKeys(tmp_path))
    with pytest.raises(Refused) as e:
        node_keys.answer(authorization)
    assert e.value.status == 401


class Reviews(Kube):
    """The API server's TokenReview answers, faked: what a real one says is covered in
    tests/cluster/test_node_identity.py; these are the answers it should never give."""

    def __init__(self, status: dict[str, Any]) -> None:
        self.status = status
        self.calls = 0

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        assert path == "/apis/authentication.k8s.io/v1/tokenreviews"
        self.calls += 1
        return {"status": self.status}


SYNCER = syncer_user()


def reviewed(
    user: str = SYNCER, extra: Any = None, audiences: Any = (AUDIENCE,), **status: Any
) -> dict[str, Any]:
    found: dict[str, Any] = {"username": user}
    if extra is not None:
        found["extra"] = extra
    answer = {"authenticated": True, "user": found, **status}
    if audiences is not None:
        answer["audiences"] = list(audiences)
    return answer


NODE_A = {NODE_NAME_EXTRA: ["node-a"]}


@pytest.mark.parametrize(
    ("status", "code", "message"),
    [
        pytest.param(reviewed(extra=NODE_A), 200, "node-a", id="good"),
        pytest.param(reviewed(extra=NODE_A, audiences=None), 401, "did not confirm", id="no-aud"),
        pytest.param(
            reviewed(extra=NODE_A, audiences=["https://kubernetes.default.svc"]),
            401,
            "did not confirm",
            id="other-audience",
        ),
        pytest.param(reviewed(extra=NODE_A, audiences="hcs-node-keys"), 401, "did not", id="str"),
        pytest.param(reviewed(), 403, "bound to no node", id="no-extra"),
        pytest.param(reviewed(extra={NODE_NAME_EXTRA: []}), 403, "bound to no node", id="empty"),
        pytest.param(reviewed(extra={NODE_NAME_EXTRA: [""]}), 403, "no node", id="empty-name"),
        pytest.param(
            reviewed(extra={NODE_NAME_EXTRA: ["node-a", "node-b"]}), 403, "no node", id="two"
        ),
        pytest.param(reviewed(extra={NODE_NAME_EXTRA: "node-a"}), 403, "no node", id="not-list"),
        pytest.param(reviewed(extra=["x"]), 403, "no node", id="extra-not-map"),
        pytest.param(
            reviewed("system:serviceaccount:hcs-system:other", NODE_A), 403, "is not", id="user"
        ),
        pytest.param({"authenticated": False, "error": "expired"}, 401, "expired", id="unauth"),
        pytest.param({"authenticated": "yes", "user": {"username": SYNCER}}, 401, "no", id="str-"),
    ],
)
def test_only_a_review_for_the_audience_of_the_syncer_on_one_node_gets_keys(
    tmp_path: Path, status: dict[str, Any], code: int, message: str
) -> None:
    secret(tmp_path, {"k1.key": K1})
    node_keys = NodeKeys(Reviews(status), ClusterKeys(tmp_path))
    if code == 200:
        assert decode(node_keys.answer("Bearer t")).node == message
        return
    with pytest.raises(Refused, match=message) as e:
        node_keys.answer("Bearer t")
    assert e.value.status == code


def jwt(exp: float) -> str:
    claims = base64.urlsafe_b64encode(json.dumps({"exp": exp}).encode()).rstrip(b"=")
    return f"eyJhbGciOiJSUzI1NiJ9.{claims.decode()}.c2ln"


def test_reviews_are_cached_until_the_token_expires_and_refusals_briefly(
    tmp_path: Path,
) -> None:
    secret(tmp_path, {"k1.key": K1})
    now = [0.0]
    kube = Reviews(reviewed(extra=NODE_A))
    node_keys = NodeKeys(kube, ClusterKeys(tmp_path), clock=lambda: now[0],
                         wall=lambda: 1_000_000 + now[0], cache_size=2)  # fmt: skip
    long_lived, short_lived = jwt(1_000_000 + 3600), jwt(1_000_000 + 90)
    for token in (long_lived, short_lived):
        node_keys.answer(f"Bearer {token}")
    now[0] = 89
    for token in (long_lived, short_lived):
        node_keys.answer(f"Bearer {token}")
    assert kube.calls == 2  # both from the cache
    now[0] = 91
    node_keys.answer(f"Bearer {short_lived}")
    assert kube.calls == 3  # the short-lived token's review ended with the token
    now[0] = 599
    node_keys.answer(f"Bearer {long_lived}")
    assert kube.calls == 3  # a success lives ten minutes: ten fetches of a syncer
    now[0] = 601
    node_keys.answer(f"Bearer {long_lived}")
    assert kube.calls == 4

    kube.status = reviewed("someone-else", NODE_A)
    for _ in range(5):
        with pytest.raises(Refused, match="is not"):
            node_keys.answer("Bearer bad")
    assert kube.calls == 5  # a repeated bad token costs one review per 10 s
    now[0] += 11
    with pytest.raises(Refused):
        node_keys.answer("Bearer bad")
    assert kube.calls == 6
    for token in ("x1", "x2", "x3"):  # the cache holds at most cache_size entries
        with pytest.raises(Refused):
            node_keys.answer(f"Bearer {token}")
    assert len(node_keys._cache) == 2


def test_token_expiry_reads_only_a_numeric_exp() -> None:
    assert token_expiry(jwt(123.0)) == 123.0
    for token in ("opaque", "a.b.c", "a.e30.c", jwt(float("inf")).replace("inf", "1e999")):
        assert token_expiry(token) is None


def test_the_extender_starts_on_an_upgraded_secret_with_a_new_key_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rotation step 1 on the Secret of earlier releases (`assignment.key`, no `signing`):
    a restarted extender keeps signing with the old key and warns, rather than exit."""
    now = [0.0]
    secret(tmp_path, {"assignment.key": K1, "k2.key": K2})
    keys = ClusterKeys(tmp_path, every=10, clock=lambda: now[0])
    assert keys() == Keyring({"assignment": K1, "k2": K2}, "assignment")
    assert caplog.text.count("signing with 'assignment'") == 1
    now[0] = 20
    keys()
    assert caplog.text.count("signing with 'assignment'") == 1  # not at every read
