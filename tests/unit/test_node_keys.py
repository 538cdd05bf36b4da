"""The extender's side of key delivery without a cluster: the Secret read again on a clock,
and callers refused before any API call. The TokenReview paths run against the real API
server in tests/cluster/test_node_identity.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from hcsd.cluster.kube import Kube
from hcsd.cluster.node_keys import ClusterKeys, NodeKeys, Refused
from hcsd.contract.keyring import Keyring
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
