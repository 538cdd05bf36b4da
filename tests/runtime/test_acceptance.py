"""A pod's assignment outlives its containers, hcsd restarts and key rotation.

The injector over a real ledger with a clock the test moves: the first container of a pod
needs a fresh assignment signed with a key the node holds; later containers of the same pod
with the same annotation need neither; a different annotation is new; a gone pod is forgotten.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hcsd.cluster.binding import signed_assignment
from hcsd.contract.assignment import ANNOTATION, Assignment, encode
from hcsd.contract.keyring import Keyring, derive
from hcsd.discovery import Inventory
from hcsd.model import Grant, PodRef
from hcsd.refusals import Reason, Refusal
from hcsd.runtime.injector import ContainerInfo, Injector
from hcsd.runtime.settings import RuntimeSection
from tests.conftest import GiB
from tests.harness.local import NODE_NAME, LocalNode, local_node

A100_0 = "GPU-5b2f0c0e-8d1a-4c11-9d2e-a100a100a000"
T0 = 1_760_000_000.0
DAY = 86400.0
POD = PodRef("team-a", "trainer", "pod-uid-1")
K1 = b"cluster-key-one-0123456789abcdef-0123456789"
K2 = b"cluster-key-two-0123456789abcdef-0123456789"
GRANTS = {"main": (Grant(A100_0, 16 * GiB, 25),)}


@dataclass
class Node:
    """hcsd's part: a ledger in `directory`, the keys it holds now, a clock the test moves."""

    directory: Path
    inventory: Inventory
    keys: dict[str, bytes] = field(default_factory=dict)
    now: float = T0
    local: LocalNode | None = None
    injector: Injector | None = None

    def start(self) -> Node:
        """(Re)start hcsd: the ledger is replayed from disk, memory starts empty."""
        if self.local is not None:
            self.local.close()
        self.local = local_node(self.directory, self.inventory, clock=lambda: self.now)
        self.injector = self.local.injector(keyring=lambda: self.keys, clock=lambda: self.now)
        return self

    def create(self, cid: str, text: str, pod: PodRef = POD) -> None:
        assert self.injector is not None
        info = ContainerInfo(cid, "main", pod, {}, {ANNOTATION: text})
        assert self.injector.create(info) is not None

    def refused(self, cid: str, text: str, pod: PodRef = POD) -> str:
        with pytest.raises(Refusal) as e:
            self.create(cid, text, pod)
        assert e.value.reason is Reason.BAD_ASSIGNMENT
        return str(e.value)

    def crash(self, cid: str) -> None:
        """The container exits and is removed (kubelet makes a new one to restart it)."""
        assert self.injector is not None
        self.injector.removed(cid)

    @property
    def accepted(self) -> list[str]:
        assert self.local is not None
        return [a.pod_uid for a in self.local.service.acceptances()]


@pytest.fixture
def node(tmp_path: Path, mixed_inventory: Inventory) -> Node:
    ring = derive(Keyring({"k1": K1}, "k1"), NODE_NAME)
    return Node(tmp_path, mixed_inventory, dict(ring.keys)).start()


def signed(cluster: Keyring, issued: float, pod: PodRef = POD) -> str:
    """What the extender's bind writes: signed with the node's key of the signing id."""
    return signed_assignment(NODE_NAME, pod.uid, GRANTS, cluster, issued)


def test_a_restart_on_day_8_is_accepted_also_after_an_hcsd_restart(node: Node) -> None:
    text = signed(Keyring({"k1": K1}, "k1"), T0 - 60)
    node.create("c1", text)
    node.crash("c1")
    node.now = T0 + 8 * DAY
    node.start()  # hcsd restarted in between: the acceptance is in the ledger
    node.create("c2", text)
    node.crash("c2")
    node.now += 600
    node.create("c3", text)


def test_a_restart_after_the_signing_key_was_retired_is_accepted(node: Node) -> None:
    text = signed(Keyring({"k1": K1}, "k1"), T0 - 60)
    node.create("c1", text)
    node.crash("c1")
    node.keys = dict(derive(Keyring({"k2": K2}, "k2"), NODE_NAME).keys)  # k1 retired
    node.now += 2 * DAY
    node.create("c2", text)


def test_a_different_annotation_for_an_accepted_pod_is_verified_as_new(node: Node) -> None:
    ring = Keyring({"k1": K1}, "k1")
    node.create("c1", signed(ring, T0 - 60))
    node.crash("c1")
    node.now += 8 * DAY
    stale = signed(ring, T0)  # genuine, but issued 8 days ago and never accepted
    assert "is stale" in node.refused("c2", stale)
    edited = json.dumps(json.loads(signed(ring, T0 - 60)), indent=1)  # same body, other text
    assert "is stale" in node.refused("c2", edited)
    node.keys = dict(derive(Keyring({"k2": K2}, "k2"), NODE_NAME).keys)
    old_key = signed(ring, node.now - 10)
    assert "key id 'k1', which this node does not hold" in node.refused("c2", old_key)
    fresh = signed(Keyring({"k2": K2}, "k2"), node.now - 10)
    node.create("c2", fresh)  # a fresh one with a current key: accepted, and remembered
    node.crash("c2")
    node.now += 8 * DAY
    node.create("c3", fresh)


def test_the_first_container_needs_a_fresh_assignment(node: Node) -> None:
    """The window is minutes (runtime.assignment_max_age), not the 7 days of before."""
    assert RuntimeSection().assignment_max_age <= 15 * 60
    text = signed(Keyring({"k1": K1}, "k1"), T0 - 601)
    assert "is stale: issued 601s ago (limit 600s)" in node.refused("c1", text)
    assert node.accepted == []


def test_an_assignment_forged_with_another_nodes_key_is_refused(node: Node) -> None:
    """Root on node A holds A's derived keys only; what it signs for this node fails."""
    node_a_keys = derive(Keyring({"k1": K1}, "k1"), "node-a")
    body = Assignment(NODE_NAME, POD.uid, T0 - 10, GRANTS, "k1")
    forged = encode(body, node_a_keys.signing_key)
    assert "does not verify" in node.refused("c1", forged)


def test_a_gone_pod_is_forgotten_after_the_grace_period_and_only_then(node: Node) -> None:
    forget_after = RuntimeSection().assignment_forget_after
    text = signed(Keyring({"k1": K1}, "k1"), T0 - 60)
    other = PodRef("team-a", "server", "pod-uid-2")
    node.create("c1", text)
    node.create("s1", signed(Keyring({"k1": K1}, "k1"), T0 - 60, other), other)
    node.crash("c1")  # the trainer holds nothing now; the server still runs
    node.now += forget_after - 1
    node.crash("nothing")  # any release sweeps
    assert sorted(node.accepted) == ["pod-uid-1", "pod-uid-2"]
    node.now += 1
    node.crash("nothing")
    assert node.accepted == ["pod-uid-2"]  # the server runs: remembered however long
    node.start()
    assert node.accepted == ["pod-uid-2"]  # durably forgotten
    assert "is stale" in node.refused("c9", text)  # the trainer's text is new again


ROTATION = [
    Keyring({"k1": K1}, "k1"),
    Keyring({"k1": K1, "k2": K2}, "k1"),  # 1. add the new key: nodes learn it
    Keyring({"k1": K1, "k2": K2}, "k2"),  # 2. sign with it
    Keyring({"k2": K2}, "k2"),  # 3. retire the old one
]


@pytest.mark.parametrize("node_lags", [False, True], ids=["in-step", "nodes-one-step-behind"])
def test_rotation_refuses_no_container_at_any_step(node: Node, node_lags: bool) -> None:
    """The documented rotation: add k2, sign with k2, retire k1. The extender signs from the
    Secret; the node verifies with the keys it fetched, which may still be the previous
    step's when the operator waited for propagation only before the next step
    (docs/cluster.md, Rotating keys). A new pod and every earlier pod's restart at each step."""
    running: dict[str, tuple[PodRef, str, str]] = {}
    for number, secret in enumerate(ROTATION):
        held = ROTATION[number - 1] if node_lags and number else secret
        node.keys = dict(derive(held, NODE_NAME).keys)
        node.now += 3600
        for uid, (pod, text, container) in running.items():
            node.crash(container)
            running[uid] = (pod, text, f"{uid}-{number}")
            node.create(f"{uid}-{number}", text, pod)
        pod = PodRef("team-a", f"job-{number}", f"uid-{number}")
        text = signed(secret, node.now - 5, pod)
        node.create(f"uid-{number}-new", text, pod)
        running[pod.uid] = (pod, text, f"uid-{number}-new")


def test_signing_with_a_key_the_nodes_have_not_learned_is_refused(node: Node) -> None:
    """Why step 1 comes first and is waited for: a node without k2 refuses what k2 signs."""
    text = signed(ROTATION[2], node.now - 5)
    assert "key id 'k2', which this node does not hold" in node.refused("c1", text)
