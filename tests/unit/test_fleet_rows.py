"""The fleet's arrays (`hcsd.cluster.fleet`): what they cannot hold is decided node by node and
never breaks a snapshot; their copies, widths and tables stay bounded."""

from __future__ import annotations

import dataclasses

import pytest

from hcsd.allocator import Usage
from hcsd.cluster.demand import demand_of
from hcsd.cluster.extender import Extender
from hcsd.cluster.fleet import WIDTH, FleetRows
from hcsd.cluster.kube import Kube
from hcsd.cluster.objects import NodeView, ObjectError, node_view
from hcsd.cluster.planner import Unfit, plan
from hcsd.contract.keyring import Keyring
from hcsd.profiles.database import ProfileDatabase
from tests.unit.fleet import beat, node_object, pod

DB = ProfileDatabase.load(None)
MiB = 2**20


def new_extender() -> Extender:
    return Extender(Kube.__new__(Kube), lambda: Keyring({"k": b"k" * 32}, "k"), DB)


def view(name: str, **kwargs: object) -> NodeView:
    return node_view(node_object(name, **kwargs))  # type: ignore[arg-type]


def with_vram(found: NodeView, vram: int) -> NodeView:
    """The node with its first device claiming `vram`, past what `node_view` admits."""
    first, *rest = found.devices
    return dataclasses.replace(found, devices=(dataclasses.replace(first, vram_bytes=vram), *rest))


def test_a_compute_node_with_an_absurd_vram_is_refused() -> None:
    obj = node_object("n1")
    obj["spec"]["devices"][0]["vramBytes"] = 2**47
    with pytest.raises(ObjectError, match="vramBytes"):
        node_view(obj)


@pytest.mark.parametrize(
    ("odd", "whole"),
    [
        pytest.param(lambda: with_vram(view("odd"), 2**47), True, id="vram-2**47"),
        pytest.param(lambda: with_vram(view("odd"), 2**62), False, id="vram-2**62"),
        pytest.param(lambda: view("odd", count=WIDTH + 4), False, id="wider-than-a-row"),
    ],
)
def test_a_node_the_rows_cannot_hold_is_decided_node_by_node(odd: object, whole: bool) -> None:
    extender = new_extender()
    found = odd()  # type: ignore[operator]
    for v in (view("n1"), found):
        extender.state.nodes.apply(v.name, v)
        beat(extender, v.name)
    snapshot = extender.state.snapshot()  # raised OverflowError under the lock for 2**47
    assert snapshot.fleet.whole[snapshot.fleet.rows["odd"]] == whole
    for vram in ("1Gi", "90Gi"):
        asked = pod({"ai.compute/vram": vram})
        demand = demand_of(asked)
        assert demand is not None
        answer = extender.filter(asked, ["n1", "odd"])
        expected = plan(demand, found.devices, found.usage({}), DB)
        if isinstance(expected, Unfit):
            assert answer.failed["odd"] == expected.reason
        else:
            assert "odd" in answer.passed


def test_a_renewal_copies_the_heartbeats_not_the_device_slots() -> None:
    extender = new_extender()
    for name in ("n1", "n2"):
        extender.state.nodes.apply(name, view(name))
        beat(extender, name)
    before = extender.state.snapshot().fleet
    beat(extender, "n1", age=-1.0)  # renewed again
    after = extender.state.snapshot().fleet
    assert after is not before and after.renewed[after.rows["n1"]] > before.renewed[0]
    assert after.key is before.key and after.vram is before.vram
    extender.state.nodes.apply("n2", view("n2", count=3))
    assert extender.state.snapshot().fleet.key is not before.key


def test_one_wide_node_does_not_widen_every_row() -> None:
    rows = FleetRows()
    for i in range(10):
        rows.put(f"n{i}", view(f"n{i}"), {})
    rows.put("wide", view("wide", count=256), {})
    fleet = rows.freeze()
    assert fleet.key.shape == (11, WIDTH)
    assert fleet.key.itemsize * 2 + fleet.health.itemsize + fleet.group.itemsize == 20


def test_the_reason_signatures_stay_bounded_by_the_fleet() -> None:
    rows = FleetRows()
    for i in range(3000):  # each put a new usage, so a new signature
        name = f"n{i % 10}"
        rows.put(name, view(name, count=1), {f"{name}-0": Usage(i * MiB)})
    assert 500 < rows.tables()[2] <= 1024


def test_chip_models_and_keysets_no_node_has_are_forgotten() -> None:
    rows = FleetRows()
    for i in range(50):
        rows.put("n1", view("n1", key_ids=[f"k{i}"]), {})
        first = view("n1").devices[0]
        rows.put("n2", dataclasses.replace(view("n2"), devices=(
            dataclasses.replace(first, model=f"M{i}"),)), {})  # fmt: skip
    assert rows.tables()[:2] == (2, 1 + 1)  # A100 and M49; n1's key set and n2's None
    rows.drop("n2")
    assert rows.tables()[:2] == (1, 1)


@pytest.mark.parametrize("container", ["", "c" * 300], ids=["empty", "too-long"])
def test_a_reason_the_allocator_cannot_word_is_an_answer_not_an_error(container: str) -> None:
    extender = new_extender()
    first = view("mixed").devices[0]
    other = dataclasses.replace(first, uuid="mixed-9", model="H800", index=9)
    for v in (view("n1"), dataclasses.replace(view("mixed"), devices=(first, other))):
        extender.state.nodes.apply(v.name, v)
        beat(extender, v.name)
    asked = pod({"ai.compute/vram": "200Gi"})
    asked["spec"]["containers"][0]["name"] = container
    answer = extender.filter(asked, ["n1", "mixed"])  # raised ValueError: a 500
    assert sorted(answer.failed) == ["mixed", "n1"] and not answer.passed
    assert "200Gi wanted" in answer.failed["n1"]
